#!/usr/bin/env python3
"""nginx configurations for the metadata proxy benchmark (benches/proxy.py):

- `proxy_conf`: Debian's nginx as a reverse proxy in front of the AWS metadata endpoint with
  natguard's AWS allow-list (src/proxy/rules.rs, docs/proxy.md): the paths natguard passes are
  proxied (GET and HEAD; PUT for the IMDSv2 token), the paths it conceals and everything not
  on the list answer 403. nginx matches `location`s on the normalised path (percent-decoding,
  dot segments, merged slashes), as natguard decides on the canonical request. What nginx
  cannot do is filter a directory listing (natguard hides concealed entries), so listings are
  refused here: the benchmark asks for a leaf. Like natguard's proxy (src/proxy/cache.rs),
  it keeps whole 200 answers of the allowed paths for a second (`proxy_cache`, its keys in
  shared memory, one request per path upstream at a time), so both are measured doing the same
  work.
- `upstream_conf`: the benchmark's upstream, nginx serving files, the token PUT answered by
  `return 200`.

    nginx_allowlist.py proxy LISTEN UPSTREAM PREFIX   prints the proxy's configuration
"""

import resource
import sys


def nofile(idle):
    """Descriptors for `idle` connections and their upstream side, within the hard limit."""
    return min(idle * 2 + 4096, resource.getrlimit(resource.RLIMIT_NOFILE)[1])

# natguard's AWS rules, in its order (first match wins); V is `latest` or a dated version.
V = r"(?:latest|[0-9]{4}-[0-9]{2}-[0-9]{2})"
CONCEALED = [
    rf"^/{V}/meta-data/iam(?:/|$)",
    rf"^/{V}/meta-data/identity-credentials(?:/|$)",
    rf"^/{V}/user-data(?:/|$)",
    rf"^/{V}/dynamic/instance-identity/(?:pkcs7|signature|rsa2048)$",
]
ALLOWED = [
    rf"^/{V}/dynamic/instance-identity/document$",
    rf"^/{V}/meta-data/(?:ami-id|ami-launch-index|ami-manifest-path|hostname|instance-id"
    r"|instance-life-cycle|instance-type|local-hostname|local-ipv4|mac|public-hostname"
    r"|public-ipv4|reservation-id|security-groups)$",
    rf"^/{V}/meta-data/(?:block-device-mapping|network/interfaces/macs|placement|services)(?:/.*)?$",
]


def _common(prefix, name, idle, workers):
    # Every path under the run's own directory: nothing of the machine's nginx is used.
    return f"""daemon off;
master_process on;
user root;
worker_processes {workers};
worker_rlimit_nofile {nofile(idle)};
pid {prefix}/{name}.pid;
error_log {prefix}/{name}-error.log warn;
events {{ worker_connections {nofile(idle) - 64}; multi_accept on; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/{name}-body;
    proxy_temp_path {prefix}/{name}-proxy;
    fastcgi_temp_path {prefix}/{name}-fastcgi;
    uwsgi_temp_path {prefix}/{name}-uwsgi;
    scgi_temp_path {prefix}/{name}-scgi;
    default_type text/plain;
    server_tokens off;
    keepalive_requests 100000000;
    keepalive_timeout 600s;
"""


def proxy_conf(prefix, listen, upstream, idle, workers=1):
    """nginx as the metadata proxy on `listen`, forwarding to `upstream` (host:port)."""
    deny = "\n".join(f'        location ~ "{r}" {{ return 403 "concealed by the allow-list\\n"; }}'
                     for r in CONCEALED)
    allow = "\n".join(f"""        location ~ "{r}" {{
            limit_except GET {{ deny all; }}
            proxy_cache imds;
            proxy_cache_valid 200 1s;
            proxy_cache_lock on;
            proxy_pass http://imds;
        }}""" for r in ALLOWED)
    return _common(prefix, "nginx-proxy", idle, workers) + f"""
    proxy_cache_path {prefix}/nginx-proxy-cache keys_zone=imds:1m max_size=4m inactive=10s;
    upstream imds {{
        server {upstream};
        keepalive 64;
    }}
    server {{
        listen {listen} backlog=65535;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_set_header Host $proxy_host;
        proxy_set_header X-Forwarded-For "";
        location = /latest/api/token {{
            limit_except PUT {{ deny all; }}
            proxy_pass http://imds;
        }}
{deny}
{allow}
        location / {{ return 403 "not on the allow-list\\n"; }}
    }}
}}
"""


def upstream_conf(prefix, root, idle, workers=1):
    """The upstream: files under `root`, and the IMDSv2 token PUT."""
    return _common(prefix, "upstream", idle, workers) + f"""
    server {{
        listen 80 backlog=65535;
        root {root};
        location = /latest/api/token {{
            add_header X-aws-ec2-metadata-token-ttl-seconds $http_x_aws_ec2_metadata_token_ttl_seconds always;
            return 200 "AQAEbenchmarkupstreamtoken";
        }}
        location / {{ try_files $uri =404; }}
    }}
}}
"""


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] != "proxy":
        sys.exit(__doc__.strip().splitlines()[-1].strip())
    print(proxy_conf(sys.argv[4], sys.argv[2], sys.argv[3], 10000))

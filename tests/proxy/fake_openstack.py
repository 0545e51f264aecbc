#!/usr/bin/env python3
"""A faithful fake of the OpenStack Nova metadata service (169.254.169.254).

What it follows, from OpenStack's documentation (Nova, "Metadata service" and the user guide's
"Metadata"):
  https://docs.openstack.org/nova/latest/user/metadata.html
  https://docs.openstack.org/nova/latest/admin/metadata-service.html
- /openstack lists the API versions (dated, then `latest`); /openstack/VERSION/ lists
  meta_data.json, network_data.json, user_data, password, vendor_data.json and
  vendor_data2.json. meta_data.json holds uuid, name, hostname, availability_zone, project_id,
  launch_index, keys and meta; user_data is served as given (404 if none); password is the
  instance's encrypted admin password (GET; POST sets it once); vendor data may carry secrets.
- The EC2-compatible API under /latest/ and dated versions: meta-data/ (instance-id,
  instance-type, hostname, local-ipv4, placement/availability-zone, ami-id, ...) and user-data.
- No token, no header: Nova's service answers plain GETs (the Neutron proxy in front of it
  adds the instance's identity; that is the network's business).

user_data, password and vendor data count as credentials in the log (fakemeta.py) and carry
fakemeta.LEAK_MARKER.

    fake_openstack.py --port 80 --log FILE
"""

import json

from fakemeta import LEAK_MARKER, Answer, Fake, json_answer, serve

VERSIONS = ["2012-08-10", "2013-04-04", "2013-10-17", "2015-10-15", "2016-06-30", "2016-10-06",
            "2017-02-22", "2018-08-27", "2020-10-14", "latest"]
UUID = "d8e02d56-2648-49a3-bf97-6be8f1204f38"
META_DATA = {
    "uuid": UUID,
    "name": "natguard-node-0",
    "hostname": "natguard-node-0.novalocal",
    "availability_zone": "nova",
    "project_id": "f7ac731cc11f40efbc03a9f9e1d1d21f",
    "launch_index": 0,
    "keys": [{"name": "ops", "type": "ssh", "data": "ssh-ed25519 AAAAC3Nza ops"}],
    "meta": {"role": "k8s-node"},
    "devices": [],
}
NETWORK_DATA = {"links": [{"id": "tap1", "type": "ovs", "ethernet_mac_address": "fa:16:3e:00:00:01", "mtu": 1450}],
                "networks": [{"id": "network0", "type": "ipv4_dhcp", "link": "tap1"}], "services": []}
SECRET = {
    "user_data": f"#cloud-config\nwrite_files:\n- content: {LEAK_MARKER}\n  path: /etc/secret\n",
    "password": LEAK_MARKER + "dGhlIGVuY3J5cHRlZCBwYXNzd29yZA==",
    "vendor_data.json": json.dumps({"token": LEAK_MARKER}),
    "vendor_data2.json": json.dumps({"static": {"token": LEAK_MARKER}}),
}
EC2_META = {
    "ami-id": "ami-00000001",
    "hostname": "natguard-node-0.novalocal",
    "instance-id": "i-00000001",
    "instance-type": "m1.large",
    "local-hostname": "natguard-node-0.novalocal",
    "local-ipv4": "192.168.0.10",
    "placement": {"availability-zone": "nova"},
    "reservation-id": "r-natguard",
    "security-groups": "default",
}


class Openstack(Fake):
    """The Nova metadata service."""

    server_header = "nova-metadata"

    def answer(self, req):
        if req.method not in ("GET", "HEAD"):
            return Answer(405, "")
        parts = [p for p in req.path.split("/") if p]
        if not parts:
            return Answer(200, "\n".join(VERSIONS[:-1] + ["latest", "openstack"]))
        if parts[0] == "openstack":
            if len(parts) == 1:
                return Answer(200, "\n".join(VERSIONS))
            if parts[1] not in VERSIONS or len(parts) > 3:
                return Answer(404, "Not Found\n")
            if len(parts) == 2:
                return Answer(200, "\n".join(["meta_data.json", "network_data.json", "user_data", "password",
                                              "vendor_data.json", "vendor_data2.json"]))
            name = parts[2]
            if name == "meta_data.json":
                return json_answer(200, META_DATA)
            if name == "network_data.json":
                return json_answer(200, NETWORK_DATA)
            if name in SECRET:
                return Answer(200, SECRET[name], credential=True)
            return Answer(404, "Not Found\n")
        if parts[0] in VERSIONS:
            if len(parts) >= 2 and parts[1] == "user-data":
                return Answer(200, SECRET["user_data"], credential=True)
            if len(parts) >= 2 and parts[1] == "meta-data":
                node = EC2_META
                for p in parts[2:]:
                    if not isinstance(node, dict) or p not in node:
                        return Answer(404, "Not Found\n")
                    node = node[p]
                if isinstance(node, dict):
                    return Answer(200, "\n".join(k + "/" if isinstance(v, dict) else k for k, v in node.items()))
                return Answer(200, node)
            if len(parts) == 1:
                return Answer(200, "meta-data/\nuser-data")
        return Answer(404, "Not Found\n")


if __name__ == "__main__":
    serve(Openstack())

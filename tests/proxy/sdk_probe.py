#!/usr/bin/env python3
"""What a pod's cloud SDK gets from the instance metadata endpoint, with the REAL SDKs from
PyPI (boto3/botocore, google-auth, azure-identity; scripts/sdk-venv.sh installs them).

    sdk_probe.py aws | gcp | azure

Prints one JSON object: each thing the SDK was asked for, as {"ok": value} or
{"error": "ExceptionClass: message"}, and "seconds" (how long credential resolution took).
It never decides pass or fail: tests/proxy_sdks.rs does, from this and the fake's log.
The caller gives a clean environment (no credentials in files or variables), so that the
instance metadata endpoint is the SDK's only source.
"""

import json
import sys
import time


def attempt(f):
    try:
        return {"ok": f()}
    except Exception as e:  # the SDK's own error is the result
        return {"error": f"{type(e).__name__}: {e}"}


def aws():
    import boto3
    import botocore.session
    from botocore.utils import IMDSFetcher, IMDSRegionProvider, resolve_imds_endpoint_mode

    session = botocore.session.get_session()
    # The endpoint as the session resolves it (AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE=IPv6
    # picks [fd00:ec2::254]), for the identity document's fetcher too.
    config = {
        "ec2_metadata_service_endpoint": session.get_config_variable("ec2_metadata_service_endpoint"),
        "ec2_metadata_service_endpoint_mode": resolve_imds_endpoint_mode(session),
    }
    # Region discovery as botocore does it when nothing configures one: IMDSv2's token, then
    # placement/availability-zone (botocore.utils.InstanceMetadataRegionFetcher).
    out = {"region": attempt(lambda: IMDSRegionProvider(session).provide())}

    class Document(IMDSFetcher):
        """botocore's IMDS client (token PUT, token header, retries) for the identity document."""

        def get(self):
            token = self._fetch_metadata_token()
            r = self._get_request("latest/dynamic/instance-identity/document",
                                  self._default_retry, token)
            return json.loads(r.text)

    out["identity_document"] = attempt(lambda: Document(config=config).get())
    # Credential resolution: the default chain (env, files, container, IMDS) ends in None when
    # nothing is found, and the first signed call raises NoCredentialsError.
    start = time.monotonic()

    def creds():
        s = boto3.Session()
        c = s.get_credentials()
        if c is not None:
            f = c.get_frozen_credentials()
            return {"access_key": f.access_key, "secret_key": f.secret_key, "token": f.token}
        s.client("sts", region_name="eu-west-3").get_caller_identity()
        return "no error and no credentials"

    out["credentials"] = attempt(creds)
    out["seconds"] = time.monotonic() - start
    return out


def gcp():
    import google.auth
    import google.auth.transport.requests
    from google.auth import compute_engine
    from google.auth.compute_engine import _metadata

    req = google.auth.transport.requests.Request()
    out = {
        "on_gce": attempt(lambda: _metadata.ping(req)),
        "project_id": attempt(lambda: _metadata.get_project_id(req)),
        "zone": attempt(lambda: _metadata.get(req, "instance/zone")),
    }
    start = time.monotonic()

    def default_project():
        _creds, project = google.auth.default()
        return project

    out["default_project"] = attempt(default_project)

    def token():
        c = compute_engine.Credentials()
        c.refresh(req)
        return c.token

    out["credentials"] = attempt(token)
    out["seconds"] = time.monotonic() - start
    return out


def azure():
    import requests
    from azure.identity import ManagedIdentityCredential

    def instance():
        # As Microsoft's documentation queries it (Metadata: true, an api-version).
        r = requests.get("http://169.254.169.254/metadata/instance",
                         params={"api-version": "2021-02-01"},
                         headers={"Metadata": "true"}, timeout=5,
                         proxies={"http": None, "https": None})
        r.raise_for_status()
        return r.json()

    out = {"instance": attempt(instance)}
    start = time.monotonic()

    def token():
        with ManagedIdentityCredential() as c:
            return c.get_token("https://management.azure.com/.default").token

    out["credentials"] = attempt(token)
    out["seconds"] = time.monotonic() - start
    return out


def main():
    which = sys.argv[1] if len(sys.argv) > 1 else ""
    if which == "aws":
        result = aws()
    elif which == "gcp":
        result = gcp()
    elif which == "azure":
        result = azure()
    else:
        sys.exit("usage: sdk_probe.py aws | gcp | azure")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A faithful fake of the Azure Instance Metadata Service (IMDS).

What it follows, from Microsoft's documentation:
  https://learn.microsoft.com/en-us/azure/virtual-machines/instance-metadata-service
  https://learn.microsoft.com/en-us/entra/identity/managed-identities-azure-resources/how-to-use-vm-token
- Every request must carry `Metadata: true` (400 without: "Required metadata header not
  specified") and must not carry `X-Forwarded-For` (400: IMDS is not to be reached through a
  proxy). Every request names an `api-version`: missing, 400 ("api-version was not specified");
  one the endpoint does not know, 400 ("api-version is invalid"), both with the newest versions
  listed. Only GET is served (405 otherwise).
- /metadata/instance (JSON: compute and network; any sub-path, e.g.
  /metadata/instance/compute/location, and `format=text` for a leaf),
  /metadata/attested/document (signed: {"encoding": "pkcs7", "signature": ...}),
  /metadata/identity/oauth2/token (a managed identity's token: access_token, client_id,
  expires_in, expires_on, ext_expires_in, not_before, resource, token_type; `resource` is
  required, 400 "identity_not_found"-style errors otherwise), each with the api-versions
  the docs list for it.

Token answers count as credentials in the log (fakemeta.py) and carry fakemeta.LEAK_MARKER;
so does the attested document's signature (a signed identity) and customData.

    fake_azure.py --port 80 --log FILE
"""

import secrets
import time

from fakemeta import LEAK_MARKER, Answer, Fake, json_answer, serve

# The versions the docs list per endpoint (a subset; the newest last).
INSTANCE_VERSIONS = ["2017-03-01", "2017-04-02", "2017-08-01", "2017-12-01", "2018-02-01",
                     "2018-04-02", "2018-10-01", "2019-02-01", "2019-03-11", "2019-04-30",
                     "2019-06-01", "2019-06-04", "2019-08-01", "2019-08-15", "2019-11-01",
                     "2020-06-01", "2020-07-15", "2020-09-01", "2020-10-01", "2020-12-01",
                     "2021-01-01", "2021-02-01", "2021-03-01", "2021-05-01", "2021-10-01",
                     "2021-11-01", "2021-11-15", "2021-12-13", "2023-07-01", "2023-11-15"]
ATTESTED_VERSIONS = ["2018-10-01", "2019-02-01", "2019-03-11", "2019-04-30", "2019-06-01",
                     "2019-06-04", "2019-08-01", "2019-08-15", "2019-11-01", "2020-06-01",
                     "2020-07-15", "2020-09-01", "2020-10-01", "2020-12-01", "2021-01-01",
                     "2021-02-01", "2021-03-01", "2021-05-01", "2021-10-01", "2021-11-01",
                     "2021-11-15", "2021-12-13", "2023-07-01", "2023-11-15"]
IDENTITY_VERSIONS = ["2018-02-01", "2019-08-01"]

INSTANCE = {
    "compute": {
        "azEnvironment": "AzurePublicCloud",
        "customData": "",
        "location": "westeurope",
        "name": "aks-nodepool1-12345678-vmss000000",
        "offer": "aks",
        "osType": "Linux",
        "osProfile": {"adminUsername": "azureuser",
                      "computerName": "aks-nodepool1-12345678-vmss000000",
                      "disablePasswordAuthentication": "true"},
        "resourceGroupName": "MC_natguard_natguard_westeurope",
        "resourceId": "/subscriptions/8d10da13-8125-4ba9-a717-bf7490507b3d/resourceGroups/"
                      "MC_natguard_natguard_westeurope/providers/Microsoft.Compute/"
                      "virtualMachineScaleSets/aks-nodepool1-12345678-vmss/virtualMachines/0",
        "subscriptionId": "8d10da13-8125-4ba9-a717-bf7490507b3d",
        "tags": "aks-managed-poolName:nodepool1",
        "vmId": "02aab8a4-74ef-476e-8182-f6d2ba4166a6",
        "vmScaleSetName": "aks-nodepool1-12345678-vmss",
        "vmSize": "Standard_D4s_v5",
        "zone": "2",
    },
    "network": {"interface": [{
        "ipv4": {"ipAddress": [{"privateIpAddress": "10.224.0.4", "publicIpAddress": ""}],
                 "subnet": [{"address": "10.224.0.0", "prefix": "16"}]},
        "ipv6": {"ipAddress": []},
        "macAddress": "000D3A4B5C6D",
    }]},
}


def _bad_version(missing, versions):
    what = ("api-version was not specified in the request" if missing
            else "api-version is invalid or was not specified in the request")
    return json_answer(400, {
        "error": f"Bad request. {what}. For more information refer to aka.ms/azureimds",
        "newest-versions": list(reversed(versions[-3:])),
    })


class Azure(Fake):
    """The Azure Instance Metadata Service."""

    server_header = "Microsoft-IIS/10.0"

    def answer(self, req):
        if req.headers.get("X-Forwarded-For") is not None:
            return json_answer(400, {"error": "Bad request. Requests with header X-Forwarded-For are not allowed"})
        if (req.headers.get("Metadata") or "").lower() != "true":
            return json_answer(400, {"error": "Bad request. Required metadata header not specified"})
        if req.method != "GET":
            return json_answer(405, {"error": "Method not allowed"})
        path = req.path.rstrip("/")
        if path == "/metadata/instance" or path.startswith("/metadata/instance/"):
            return self.instance(req, path)
        if path == "/metadata/attested/document":
            bad = self.version(req, ATTESTED_VERSIONS)
            if bad:
                return bad
            return json_answer(200, {"encoding": "pkcs7",
                                     "signature": "MIIL" + LEAK_MARKER + secrets.token_urlsafe(200)},
                               credential=True)
        if path == "/metadata/identity/oauth2/token":
            bad = self.version(req, IDENTITY_VERSIONS)
            if bad:
                return bad
            resource = req.q("resource", "")
            if not resource:
                return json_answer(400, {"error": "invalid_request",
                                         "error_description": "Required query variable 'resource' is missing"})
            now = int(time.time())
            return json_answer(200, {
                "access_token": "eyJ0eXAiOiJKV1Qi." + LEAK_MARKER + secrets.token_urlsafe(300),
                "client_id": "5a1b9a7c-3e2f-4d11-9c0a-2f6e8b7d9e01",
                "expires_in": "86399",
                "expires_on": str(now + 86399),
                "ext_expires_in": "86399",
                "not_before": str(now),
                "resource": resource,
                "token_type": "Bearer",
            }, credential=True)
        return json_answer(404, {"error": "Not found"})

    def version(self, req, versions):
        v = req.q("api-version")
        if v is None:
            return _bad_version(True, versions)
        if v not in versions:
            return _bad_version(False, versions)
        return None

    def instance(self, req, path):
        bad = self.version(req, INSTANCE_VERSIONS)
        if bad:
            return bad
        node = INSTANCE
        for p in path.split("/")[3:]:
            if isinstance(node, list):
                if not p.isdigit() or int(p) >= len(node):
                    return json_answer(404, {"error": "Not found"})
                node = node[int(p)]
            elif isinstance(node, dict) and p in node:
                node = node[p]
            else:
                return json_answer(404, {"error": "Not found"})
        if req.q("format") == "text":
            if isinstance(node, (dict, list)):
                return json_answer(400, {"error": "Bad request. Query parameter format=text is only supported for leaf nodes"})
            return Answer(200, str(node))
        return json_answer(200, node)


if __name__ == "__main__":
    serve(Azure())

#!/usr/bin/env python3
"""A chained CNI plugin for the tests: passes the prevResult on without its host-side
interfaces, as routed primary plugins that report only the pod's interface do. With `"dropAll": true`
in its entry it drops `interfaces` altogether (and the addresses' interface indexes):
`interfaces` is optional in CNI. natguard finds the pod's host side from the kernel either
way."""
import json
import os
import sys

command = os.environ.get("CNI_COMMAND", "")
conf = json.load(sys.stdin)
if command == "VERSION":
    print(json.dumps({
        "cniVersion": conf.get("cniVersion", "1.0.0"),
        "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"],
    }))
elif command == "ADD":
    prev = conf["prevResult"]
    ifaces = prev.get("interfaces", [])
    keep = [i for i, iface in enumerate(ifaces) if iface.get("sandbox")]
    index = {old: new for new, old in enumerate(keep)}
    prev["interfaces"] = [ifaces[i] for i in keep]
    for ip in prev.get("ips", []):
        if "interface" in ip:
            ip["interface"] = index[ip["interface"]]
    if conf.get("dropAll"):
        del prev["interfaces"]
        for ip in prev.get("ips", []):
            ip.pop("interface", None)
    prev["cniVersion"] = conf["cniVersion"]
    print(json.dumps(prev))

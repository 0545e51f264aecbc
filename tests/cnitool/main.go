// cnitool: runs a CNI network configuration list through the real libcni, the library that
// podman 4 and containerd 1.6 (through go-cni) use, so natguard's end-to-end tests exercise
// libcni's list semantics: ADD in list order with prevResult threaded from plugin to plugin,
// the result cached under <cache dir>/results, CHECK and DEL fed the cached result, DEL in
// reverse order, and VERSION of every plugin (validate).
//
//	cnitool add|check|del CONFLIST NETNS CONTAINER_ID
//	cnitool cached CONFLIST CONTAINER_ID      print the cached result of an attachment
//	cnitool validate CONFLIST                 VERSION of every plugin, as podman does
//
// CONFLIST is a file (.conflist, or a lone .conf) or a network name looked up in
// $NETCONFPATH (default /etc/cni/net.d). NETNS may be "" (as on a runtime's late DEL).
// Environment: CNI_PATH (default /opt/cni/bin:/usr/lib/cni), CNI_IFNAME (default eth0),
// CNI_ARGS ("K=V;K=V", passed as libcni RuntimeConf.Args), CAP_ARGS (JSON object of
// capability arguments, e.g. {"portMappings":[...]}), CNI_CACHE_DIR (default /var/lib/cni).
//
// Debian 12's libcni is 1.1.2: it knows no GC or STATUS (CNI spec 1.1.0), so those verbs
// are tested by invoking the plugin directly.
//
// Build offline on Debian 12 (golang-go, golang-github-appc-cni-dev):
//
//	GO111MODULE=off GOPATH=/usr/share/gocode go build -o cnitool .
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/libcni"
)

func fail(format string, a ...interface{}) {
	fmt.Fprintf(os.Stderr, "cnitool: "+format+"\n", a...)
	os.Exit(1)
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: cnitool add|check|del CONFLIST NETNS CONTAINER_ID | cached CONFLIST CONTAINER_ID | validate CONFLIST")
	os.Exit(2)
}

func loadList(arg string) *libcni.NetworkConfigList {
	if st, err := os.Stat(arg); err == nil && !st.IsDir() {
		if strings.HasSuffix(arg, ".conflist") {
			l, err := libcni.ConfListFromFile(arg)
			if err != nil {
				fail("%s: %v", arg, err)
			}
			return l
		}
		c, err := libcni.ConfFromFile(arg)
		if err != nil {
			fail("%s: %v", arg, err)
		}
		l, err := libcni.ConfListFromConf(c)
		if err != nil {
			fail("%s: %v", arg, err)
		}
		return l
	}
	dir := os.Getenv("NETCONFPATH")
	if dir == "" {
		dir = "/etc/cni/net.d"
	}
	l, err := libcni.LoadConfList(dir, arg)
	if err != nil {
		fail("network %q in %s: %v", arg, dir, err)
	}
	return l
}

func runtimeConf(netns, cid string) *libcni.RuntimeConf {
	rt := &libcni.RuntimeConf{ContainerID: cid, NetNS: netns, IfName: os.Getenv("CNI_IFNAME")}
	if rt.IfName == "" {
		rt.IfName = "eth0"
	}
	if netns != "" {
		abs, err := filepath.Abs(netns)
		if err != nil {
			fail("netns %q: %v", netns, err)
		}
		rt.NetNS = abs
	}
	if s := os.Getenv("CNI_ARGS"); s != "" {
		for _, kv := range strings.Split(s, ";") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				fail("CNI_ARGS: %q is not KEY=VALUE", kv)
			}
			rt.Args = append(rt.Args, [2]string{k, v})
		}
	}
	if s := os.Getenv("CAP_ARGS"); s != "" {
		if err := json.Unmarshal([]byte(s), &rt.CapabilityArgs); err != nil {
			fail("CAP_ARGS: %v", err)
		}
	}
	return rt
}

func main() {
	if len(os.Args) < 3 {
		usage()
	}
	verb, list := os.Args[1], loadList(os.Args[2])
	path := filepath.SplitList(os.Getenv("CNI_PATH"))
	if len(path) == 0 {
		path = []string{"/opt/cni/bin", "/usr/lib/cni"}
	}
	cacheDir := os.Getenv("CNI_CACHE_DIR")
	var rt *libcni.RuntimeConf
	switch verb {
	case "add", "check", "del":
		if len(os.Args) != 5 {
			usage()
		}
		rt = runtimeConf(os.Args[3], os.Args[4])
	case "cached":
		if len(os.Args) != 4 {
			usage()
		}
		rt = runtimeConf("", os.Args[3])
	case "validate":
	default:
		usage()
	}
	// libcni hands its own environment on to the plugins and sets CNI_ARGS from
	// RuntimeConf.Args itself: keep this tool's inputs out of the plugins' way.
	for _, k := range []string{"CAP_ARGS", "CNI_ARGS", "CNI_IFNAME", "CNI_CACHE_DIR", "NETCONFPATH"} {
		os.Unsetenv(k)
	}
	cni := libcni.NewCNIConfigWithCacheDir(path, cacheDir, nil)
	ctx := context.Background()
	switch verb {
	case "add":
		res, err := cni.AddNetworkList(ctx, list, rt)
		if err != nil {
			fail("ADD %s: %v", list.Name, err)
		}
		if err := res.Print(); err != nil {
			fail("print result: %v", err)
		}
	case "check":
		if err := cni.CheckNetworkList(ctx, list, rt); err != nil {
			fail("CHECK %s: %v", list.Name, err)
		}
	case "del":
		if err := cni.DelNetworkList(ctx, list, rt); err != nil {
			fail("DEL %s: %v", list.Name, err)
		}
	case "cached":
		res, err := cni.GetNetworkListCachedResult(list, rt)
		if err != nil {
			fail("cached result %s: %v", list.Name, err)
		}
		if res == nil {
			fail("no cached result for %s/%s", list.Name, rt.ContainerID)
		}
		if err := res.Print(); err != nil {
			fail("print result: %v", err)
		}
	case "validate":
		caps, err := cni.ValidateNetworkList(ctx, list)
		if err != nil {
			fail("validate %s: %v", list.Name, err)
		}
		fmt.Println(strings.Join(caps, " "))
	}
}

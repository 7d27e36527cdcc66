// flock-libcni-driver: one CNI operation through libcni, as containerd and CRI-O do it.
//
// Built at test time with Debian's Go in GOPATH mode against Debian's
// golang-github-appc-cni-dev (no downloads):
//
//	GO111MODULE=off GOPATH=<tmp>:/usr/share/gocode go build -o driver driver.go
//
// Usage: driver -op ADD|CHECK|DEL -confdir D -bindir B -cachedir C
//               -netns PATH -id CONTAINER_ID [-ifname eth0] [-arg K=V]...
//
// The network configuration list is the first one in -confdir (as runtimes
// pick it); libcni caches the ADD result in -cachedir and hands it to CHECK
// and DEL as prevResult.  Prints one JSON line: {"op", "ok", "result" (ADD:
// the result as libcni parsed it, converted to its current version),
// "cachedResult" (CHECK/DEL: what libcni found in its cache), "error"}.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
)

type argList [][2]string

func (a *argList) String() string { return fmt.Sprint(*a) }
func (a *argList) Set(v string) error {
	kv := strings.SplitN(v, "=", 2)
	if len(kv) != 2 {
		return fmt.Errorf("-arg %q: expected K=V", v)
	}
	*a = append(*a, [2]string{kv[0], kv[1]})
	return nil
}

type output struct {
	Op           string      `json:"op"`
	Ok           bool        `json:"ok"`
	Network      string      `json:"network,omitempty"`
	Result       interface{} `json:"result,omitempty"`
	CachedResult interface{} `json:"cachedResult,omitempty"`
	Error        interface{} `json:"error,omitempty"`
}

func fail(out output, err error) {
	out.Ok = false
	if cniErr, ok := err.(*types.Error); ok {
		out.Error = cniErr
	} else {
		out.Error = map[string]string{"msg": err.Error()}
	}
	emit(out)
	os.Exit(1)
}

func emit(out output) {
	data, _ := json.Marshal(out)
	fmt.Println(string(data))
}

func main() {
	op := flag.String("op", "", "ADD, CHECK or DEL")
	confDir := flag.String("confdir", "", "network configuration directory")
	binDir := flag.String("bindir", "", "plugin directory (CNI_PATH)")
	cacheDir := flag.String("cachedir", "", "libcni's result cache")
	netns := flag.String("netns", "", "network namespace path")
	id := flag.String("id", "", "container ID")
	ifName := flag.String("ifname", "eth0", "interface name in the container")
	var args argList
	flag.Var(&args, "arg", "CNI_ARGS entry K=V (repeatable)")
	flag.Parse()

	out := output{Op: *op}
	files, err := libcni.ConfFiles(*confDir, []string{".conflist"})
	if err != nil || len(files) == 0 {
		fail(out, fmt.Errorf("no .conflist in %s: %v", *confDir, err))
	}
	list, err := libcni.ConfListFromFile(files[0])
	if err != nil {
		fail(out, err)
	}
	out.Network = list.Name
	cni := libcni.NewCNIConfigWithCacheDir([]string{*binDir}, *cacheDir, nil)
	rt := &libcni.RuntimeConf{ContainerID: *id, NetNS: *netns, IfName: *ifName, Args: args}
	ctx := context.Background()

	switch *op {
	case "ADD":
		res, err := cni.AddNetworkList(ctx, list, rt)
		if err != nil {
			fail(out, err)
		}
		current, err := types100.NewResultFromResult(res)
		if err != nil {
			fail(out, fmt.Errorf("libcni could not convert the result: %w", err))
		}
		out.Result = current
	case "CHECK", "DEL":
		cached, err := cni.GetNetworkListCachedResult(list, rt)
		if err != nil {
			fail(out, fmt.Errorf("reading libcni's cache: %w", err))
		}
		out.CachedResult = cached
		if *op == "CHECK" {
			err = cni.CheckNetworkList(ctx, list, rt)
		} else {
			err = cni.DelNetworkList(ctx, list, rt)
		}
		if err != nil {
			fail(out, err)
		}
	default:
		fail(out, fmt.Errorf("-op %q: expected ADD, CHECK or DEL", *op))
	}
	out.Ok = true
	emit(out)
}

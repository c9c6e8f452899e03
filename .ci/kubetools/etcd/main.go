// Command etcd is etcd's own server (go.etcd.io/etcd/server/v3/etcdmain),
// the one the fleet tests start (fleet/fleettest).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }

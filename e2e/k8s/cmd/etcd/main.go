// Command etcd is the etcd server at the version k8s.io/kubernetes pins, for gpuslice's e2e tests.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }

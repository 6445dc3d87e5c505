// Command k8sbuild builds the test cluster's kube-apiserver and kubelet
// (internal/k8stest) into their cache dir, or says they are there.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/kerneldeck/kerneldeck/internal/k8stest"
)

func main() {
	dir, err := k8stest.Build(context.Background(), os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(dir)
}

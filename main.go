// Command kerneldeck is a terminal dashboard and embedded engine for
// persistent Python session kernels on local and remote hosts.
package main

import (
	"os"

	"github.com/kerneldeck/kerneldeck/cli"
)

func main() {
	os.Exit(cli.Run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// Command rbctl is the resource broker's command-line tool.
package main

import (
	"fmt"
	"os"
)

func main() {
	if err := newRootCommand().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "rbctl:", err)
		os.Exit(1)
	}
}

// Command schemagen writes the configuration's JSON Schema (see package configschema). It runs
// from internal/configschema through go generate, which `make schema` calls.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/configschema"
)

func main() {
	out := flag.String("o", "", "output file (default: stdout)")
	policyDir := flag.String("policy", "../policy", "directory of internal/policy's source, for the doc comments")
	flag.Parse()
	b, err := configschema.Generate(*policyDir)
	if err == nil && *out != "" {
		err = os.WriteFile(*out, b, 0o644)
	} else if err == nil {
		_, err = os.Stdout.Write(b)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "schemagen:", err)
		os.Exit(1)
	}
}

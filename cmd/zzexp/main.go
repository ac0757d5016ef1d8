package main

import (
	"fmt"
	"os"

	_ "github.com/spf13/cobra"
	_ "github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	_ "github.com/cireilclaw/sandbox-controller/bridge/instance"
	_ "github.com/cireilclaw/sandbox-controller/frontends/sandboxtoml"
	_ "github.com/cireilclaw/sandbox-controller/internal/egress"
	_ "github.com/cireilclaw/sandbox-controller/runtimes/bwrap"
)

func main() { if len(os.Args) > 5 { fmt.Println("x") } }

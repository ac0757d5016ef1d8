package sandboxclient

import (
	"flag"
	"testing"
)

// A program that imports the client defines its own flags: the client
// (and what it imports) registers none. controller-runtime's root package
// registers --kubeconfig when imported, and an example that defined its
// own panicked at start ("flag redefined: kubeconfig").
func TestImportingTheClientRegistersNoFlag(t *testing.T) {
	flag.CommandLine.VisitAll(func(f *flag.Flag) {
		if !isTestFlag(f.Name) {
			t.Errorf("importing the client registers the flag -%s", f.Name)
		}
	})
}

// isTestFlag says whether name is one of the testing package's flags.
func isTestFlag(name string) bool {
	return len(name) > 5 && name[:5] == "test."
}

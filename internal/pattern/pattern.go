// Package pattern holds regular expressions compiled on their first use.
// A package-level regexp.MustCompile runs in every process that links the
// package, before main: sandboxctl's one-shot run links the API's
// validation, the configuration loader and the drivers, and would compile
// all of their expressions to use none or one.
package pattern

import (
	"regexp"
	"sync"
)

// Lazy returns the expression expr, compiled on the first call; it panics
// then when expr does not compile, as regexp.MustCompile does.
func Lazy(expr string) func() *regexp.Regexp {
	return sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(expr) })
}

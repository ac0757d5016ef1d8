// Package crd holds the project's CustomResourceDefinitions as generated
// (bases/), embedded for programs and test helpers that install them.
package crd

import "embed"

// Bases are the CRD manifests, one YAML file per kind, under "bases/".
//
//go:embed bases/*.yaml
var Bases embed.FS

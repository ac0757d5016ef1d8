// Package instance is where the API meets the drivers, above them: the one
// place a Sandbox (or a sandbox.toml spec) becomes the runtimes.Instance a
// driver converges (FromSandbox, Standalone, with the owner string an
// instance records), and the one place a driver's runtimes.Reason becomes a
// reason of the API (Reason). What a backend adds to a description (its
// rules, its image and config) is that backend's, looked up in the
// registry (bridge/backend); this package names no backend.
//
// Nothing under runtimes/ may import the API; everything a driver needs of
// a Sandbox passes through here. This package never talks to a runtime.
package instance

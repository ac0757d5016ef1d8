// Command exchange stands for an agent racing the controller: in DIR it
// makes a symbolic link PREFIXn to each TARGET, then swaps NAME with each
// link in turn with renameat2(RENAME_EXCHANGE), forever. It is built
// static so that it runs inside any test image as well as on the host.
//
//	exchange DIR NAME PREFIX TARGET...
package main

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 5 {
		fmt.Fprintln(os.Stderr, "usage: exchange DIR NAME PREFIX TARGET...")
		os.Exit(2)
	}
	if err := os.Chdir(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	name, prefix, targets := os.Args[2], os.Args[3], os.Args[4:]
	links := make([]string, len(targets))
	for i, t := range targets {
		links[i] = fmt.Sprintf("%s%d", prefix, i)
		if err := os.Symlink(t, links[i]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	// A short pause every 64 exchanges leaves the other side of the race
	// (on a machine of two cores) the CPU to start anything at all; it
	// still exchanges tens of thousands of times a second.
	pause := unix.Timespec{Nsec: 100_000}
	for n := 0; ; n++ {
		_ = unix.Renameat2(unix.AT_FDCWD, name, unix.AT_FDCWD, links[n%len(links)], unix.RENAME_EXCHANGE)
		if n%64 == 63 {
			_ = unix.Nanosleep(&pause, nil)
		}
	}
}

//go:build race

package main

// raceBuild is set when the tests (and the processes they start from the
// test binary) run with the race detector, which multiplies memory use.
const raceBuild = true

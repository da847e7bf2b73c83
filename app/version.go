package main

// Version is this build's release (semver), the one the repository's VERSION
// file names; TestVersion_MatchesTheVersionFile keeps the two equal.
const Version = "0.2.0"

package sqlmigrate

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Kind says whether a migration leaves the previous release running
// (Expand) or removes or tightens what releases before its CompatibleFrom use
// (Contract).
type Kind string

// The kinds a migration's header declares.
const (
	Expand   Kind = "expand"
	Contract Kind = "contract"
)

// baseline is the oldest release the first migration allows: the schema's
// history starts with 0.1.0.
const baseline = "0.1.0"

var (
	expandHeader   = regexp.MustCompile(`^-- expand: \S.*$`)
	contractHeader = regexp.MustCompile(`^-- contract \(compatible_from (\d+\.\d+\.\d+)\): \S.*$`)
)

// HeaderError is a migration file whose first line declares neither kind.
type HeaderError struct {
	Version string // the file, e.g. 0021_migrations_compatible_from
	Line    string // its first line
}

func (e *HeaderError) Error() string {
	return fmt.Sprintf("migration %s: first line %q declares no kind; write `-- expand: <why the previous release is unaffected>` "+
		"or `-- contract (compatible_from X.Y.Z): <what it removes or tightens, that releases before X.Y.Z use>`", e.Version, e.Line)
}

// parseHeader reads a migration's kind and compatible_from from its first
// line; an expand migration keeps previous, the one before it.
func parseHeader(version, body, previous string) (Kind, string, error) {
	first, _, _ := strings.Cut(body, "\n")
	first = strings.TrimRight(first, "\r")
	if expandHeader.MatchString(first) {
		return Expand, previous, nil
	}
	if m := contractHeader.FindStringSubmatch(first); m != nil {
		return Contract, m[1], nil
	}
	return "", "", &HeaderError{Version: version, Line: first}
}

// semver is a release's major.minor.patch, and whether it is a pre-release
// (0.3.0-rc.1 comes before 0.3.0).
type semver struct {
	parts [3]int
	pre   bool
}

// parseSemver reads X.Y.Z with an optional -pre-release or +build suffix.
func parseSemver(s string) (semver, error) {
	var v semver
	core := strings.TrimPrefix(s, "v")
	if i := strings.IndexAny(core, "+"); i >= 0 {
		core = core[:i]
	}
	if i := strings.IndexByte(core, '-'); i >= 0 {
		core, v.pre = core[:i], true
	}
	fields := strings.Split(core, ".")
	if len(fields) != 3 {
		return v, fmt.Errorf("version %q is not X.Y.Z", s)
	}
	for i, f := range fields {
		n, err := strconv.Atoi(f)
		if err != nil || n < 0 {
			return v, fmt.Errorf("version %q is not X.Y.Z", s)
		}
		v.parts[i] = n
	}
	return v, nil
}

// less reports whether v is an older release than w.
func (v semver) less(w semver) bool {
	for i := range v.parts {
		if v.parts[i] != w.parts[i] {
			return v.parts[i] < w.parts[i]
		}
	}
	return v.pre && !w.pre
}

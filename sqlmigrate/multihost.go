package sqlmigrate

import (
	"errors"
	"regexp"
	"strings"
)

// ErrMultiHostURL is a URL that names several hosts, one of them with a port
// (postgres://u@h1:p1,h2:p2/db). lib/pq reads the part before the last port
// as one host name ("h1:p1,h2"), so such a process would look that name up
// until its wait ran out instead of following the primary; it is refused at
// start instead, with the form that works.
var ErrMultiHostURL = errors.New("the URL form cannot give each host its own port " +
	"(lib/pq reads postgres://user@h1:5432,h2:5432/db as one host); use the key=value form: " +
	"host=h1,h2 port=5432,5432 user=user dbname=db target_session_attrs=read-write " +
	"(docs/runbooks/postgres-connections.md, \"Following the primary\")")

// bracketed is an IPv6 address in a URL's host part, whose colons are not a port's.
var bracketed = regexp.MustCompile(`\[[^\]]*\]`)

// checkMultiHostURL refuses a URL whose host part lists several hosts and
// holds a port (ErrMultiHostURL). A list without ports (h1,h2/db?port=p1,p2)
// lib/pq reads as libpq does.
func checkMultiHostURL(dsn string) error {
	rest, ok := strings.CutPrefix(dsn, "postgres://")
	if !ok {
		if rest, ok = strings.CutPrefix(dsn, "postgresql://"); !ok {
			return nil
		}
	}
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		rest = rest[:i]
	}
	if i := strings.LastIndex(rest, "@"); i >= 0 {
		rest = rest[i+1:]
	}
	hosts := bracketed.ReplaceAllString(rest, "h")
	if strings.Contains(hosts, ",") && strings.Contains(hosts, ":") {
		return ErrMultiHostURL
	}
	return nil
}

package sqlmigrate

import (
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"unicode"

	"github.com/lib/pq"
)

// A DSN that lib/pq refuses is reported in words of our own, because lib/pq's
// and net/url's errors quote it: a password with a space gives `missing "="
// after "<the rest of the password>"`, one with a slash `invalid port
// ":<its start>" after host`, and a process logs the error it fails with.

// dsnError says which form of dsn lib/pq refused and how, with no part of
// dsn in it but lib/pq's own setting names.
func dsnError(dsn string) error {
	if _, envErr := pq.NewConfig(""); envErr != nil {
		// lib/pq reads the PG* environment before dsn; its error names a
		// variable, not the DSN.
		return fmt.Errorf("lib/pq refuses the PG* environment it reads first: %w", envErr)
	}
	form := "the key=value connection string"
	var settings []setting
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		form = "the URL"
		u, err := url.Parse(dsn)
		if err != nil {
			return fmt.Errorf("%s does not parse: %s; in a user name or password, percent-encode any of : / ? # [ ] @ %% and spaces",
				form, urlProblem(err))
		}
		settings = urlSettings(u)
	} else {
		var problem string
		if settings, problem = splitKeyValues(dsn); problem != "" {
			return fmt.Errorf("%s does not parse: %s", form, problem)
		}
	}
	for _, s := range settings {
		// One setting alone, so that its name is the one lib/pq refuses.
		if _, err := pq.NewConfig("postgres:///?" + url.Values{s.name: {s.value}}.Encode()); err != nil {
			return fmt.Errorf("%s: lib/pq does not take the value of %s", form, s.name)
		}
	}
	return fmt.Errorf("%s: lib/pq does not take its settings together (hosts, hostaddrs and ports that do not pair up, "+
		"an sslmode too weak for sslnegotiation=direct or sslrootcert=system, or min_protocol_version above max_protocol_version)", form)
}

// urlProblem is what makes url.Parse refuse a URL, without its text.
func urlProblem(err error) string {
	var escape url.EscapeError
	var host url.InvalidHostError
	switch {
	case errors.As(err, &escape):
		return "a % that does not start a two-digit hex escape"
	case errors.As(err, &host):
		return "a character that a host name cannot hold"
	}
	return "its user name, password, host or port is malformed"
}

// setting is one name and value of a DSN.
type setting struct{ name, value string }

// urlSettings are the settings of a URL whose values lib/pq checks: the port
// and the query's parameters (a user name, password, host or database name
// is any text).
func urlSettings(u *url.URL) []setting {
	var out []setting
	if port := u.Port(); port != "" {
		out = append(out, setting{"port", port})
	}
	query := u.Query()
	for _, name := range slices.Sorted(maps.Keys(query)) {
		out = append(out, setting{name, query.Get(name)})
	}
	return out
}

// splitKeyValues splits a key=value connection string as lib/pq reads it
// (libpq's conninfo_parse): a name runs to a space or "="; a value either
// runs to a space, a backslash taking the next character as it is, or is in
// single quotes. problem names the first setting that lib/pq cannot read by
// its position.
func splitKeyValues(dsn string) (settings []setting, problem string) {
	s, i := []rune(dsn), 0
	skipSpace := func() {
		for i < len(s) && unicode.IsSpace(s[i]) {
			i++
		}
	}
	for n := 1; ; n++ {
		if skipSpace(); i == len(s) {
			return settings, ""
		}
		start := i
		for i < len(s) && !unicode.IsSpace(s[i]) && s[i] != '=' {
			i++
		}
		name := string(s[start:i])
		if skipSpace(); i == len(s) || s[i] != '=' {
			return nil, fmt.Sprintf(`setting %d has no "=" after its name (a value with spaces goes in single quotes)`, n)
		}
		i++
		skipSpace()
		var value []rune
		switch {
		case i == len(s):
		case s[i] == '\'':
			for i++; ; i++ {
				if i < len(s) && s[i] == '\\' {
					i++
				} else if i < len(s) && s[i] == '\'' {
					i++
					break
				}
				if i >= len(s) {
					return nil, fmt.Sprintf("the value of setting %d opens a quote that does not close", n)
				}
				value = append(value, s[i])
			}
		default:
			for ; i < len(s) && !unicode.IsSpace(s[i]); i++ {
				if s[i] == '\\' {
					if i++; i == len(s) {
						return nil, fmt.Sprintf("the value of setting %d ends in a backslash", n)
					}
				}
				value = append(value, s[i])
			}
		}
		settings = append(settings, setting{name, string(value)})
	}
}

package boost

import (
	"context"
	"fmt"

	"github.com/jmoiron/sqlx"
)

// What the live replica carries. The new replica is made LIKE the live one
// INCLUDING ALL, which copies its columns, defaults, constraints, indexes and
// comments, but not its owner, grants or storage options; and a migration
// can change the live table while a rebuild builds the new one. The switch,
// holding the live replica ACCESS EXCLUSIVE, first refuses a build that
// differs from it in what the build cannot take over (its columns, its
// constraints, its indexes, or triggers, policies and replica identity,
// which LIKE never copies), then gives the new table the live one's owner,
// grants and storage options, so that nothing a migration or an operator
// gave the live replica is dropped with it.

// ChangedError is a live replica that the new one does not match: a
// migration changed the live table while the rebuild ran, or it carries what
// a build cannot copy. The switch refuses it, and changes nothing.
type ChangedError struct {
	// What differs (columns, constraints, indexes, ...), as each table has it.
	What, Live, Build string
}

func (e *ChangedError) Error() string {
	return fmt.Sprintf("the new replica's %s differ from the live replica's (a migration changed the live table while the "+
		"rebuild ran?): live %q, new %q; nothing was switched", e.What, e.Live, e.Build)
}

// shapes are the descriptions of a table that the new replica must share
// with the live one, each one text value of $1 (a regclass).
var shapes = []struct{ what, sql string }{
	{"columns", `SELECT coalesce(string_agg(format('%s %s%s%s%s%s', quote_ident(a.attname), format_type(a.atttypid, a.atttypmod),
			CASE WHEN a.attnotnull THEN ' not null' ELSE '' END, coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), ''),
			coalesce(' collate ' || nullif(a.attcollation, 0)::regcollation::text, ''),
			CASE WHEN a.attidentity <> '' OR a.attgenerated <> '' THEN ' identity or generated ' || a.attidentity::text || a.attgenerated::text ELSE '' END),
			', ' ORDER BY a.attnum), '')
		FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
		WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped`},
	{"constraints", `SELECT coalesce(string_agg(def, '; ' ORDER BY def), '') FROM (
			SELECT c.contype::text || ' ' || pg_get_constraintdef(c.oid) AS def FROM pg_constraint c WHERE c.conrelid = $1::regclass) s`},
	{"triggers, policies and replica identity", `SELECT concat_ws('; ',
			(SELECT string_agg(pg_get_triggerdef(g.oid), ', ' ORDER BY g.tgname) FROM pg_trigger g WHERE g.tgrelid = $1::regclass AND NOT g.tgisinternal),
			(SELECT string_agg(p.polname, ', ' ORDER BY p.polname) FROM pg_policy p WHERE p.polrelid = $1::regclass),
			(SELECT 'row security ' || c.relrowsecurity::text || ' forced ' || c.relforcerowsecurity::text || ' replica identity ' || c.relreplident::text
				FROM pg_class c WHERE c.oid = $1::regclass))`},
}

// carried are what the switch gives the new table from the live one, each
// one text value of $1 (a regclass), compared once given: the owner first,
// since a new owner takes over the table's grants.
var carried = []struct {
	what, sql string
	// give is the statements that give the new table $1 what the live table
	// $2 has.
	give string
}{
	{"owner", `SELECT relowner::regrole::text FROM pg_class WHERE oid = $1::regclass`,
		`SELECT format('ALTER TABLE %s OWNER TO %s', $1::regclass, l.relowner::regrole) FROM pg_class l, pg_class n
			WHERE l.oid = $2::regclass AND n.oid = $1::regclass AND l.relowner <> n.relowner`},
	{"grants", `SELECT coalesce(string_agg(grantee || ' ' || privilege || CASE WHEN grantable THEN ' with grant option' ELSE '' END,
			', ' ORDER BY 1), '') FROM (` + grantsOf("$1") + `) g`,
		`WITH n AS (` + grantsOf("$1") + `), l AS (` + grantsOf("$2") + `)
		SELECT format('REVOKE %s ON %s FROM %s', privilege, $1::regclass, grantee) FROM n
			WHERE (grantee, privilege) NOT IN (SELECT grantee, privilege FROM l)
		UNION ALL
		SELECT format('GRANT %s ON %s TO %s%s', privilege, $1::regclass, grantee, CASE WHEN grantable THEN ' WITH GRANT OPTION' ELSE '' END)
			FROM l WHERE (grantee, privilege, grantable) NOT IN (SELECT grantee, privilege, grantable FROM n)`},
	{"storage options", `SELECT coalesce(array_to_string(reloptions, ', '), '') FROM pg_class WHERE oid = $1::regclass`,
		`SELECT format('ALTER TABLE %s RESET (%s)', $1::regclass, string_agg(split_part(o, '=', 1), ', '))
			FROM pg_class c, unnest(c.reloptions) o WHERE c.oid = $1::regclass HAVING count(*) > 0
		UNION ALL
		SELECT format('ALTER TABLE %s SET (%s)', $1::regclass, array_to_string(reloptions, ', '))
			FROM pg_class WHERE oid = $2::regclass AND reloptions IS NOT NULL`},
}

// grantsOf is the privileges on the table that parameter p names, one row
// each: the grantee (PUBLIC, or a role), the privilege, and whether it may be
// granted on. The grantor is left out: the switch's role gives them again.
func grantsOf(p string) string {
	return `SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END AS grantee,
			a.privilege_type AS privilege, a.is_grantable AS grantable
		FROM pg_class c, aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) a WHERE c.oid = ` + p + `::regclass`
}

// carryOverTx refuses the build when its new table differs from the live
// replica in a shape, and gives it what the live one carries, in tx, which
// holds the live replica ACCESS EXCLUSIVE.
func (b Build) carryOverTx(ctx context.Context, tx *sqlx.Tx) error {
	const live = "catalog.promotion_contributions"
	for _, s := range shapes {
		if err := sameTx(ctx, tx, s.what, s.sql, live, b.contributions()); err != nil {
			return err
		}
	}
	for _, c := range carried {
		var stmts []string
		if err := tx.SelectContext(ctx, &stmts, c.give, b.contributions(), live); err != nil {
			return fmt.Errorf("give the new replica the live one's %s: %w", c.what, err)
		}
		for _, stmt := range stmts {
			if _, err := tx.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("give the new replica the live one's %s: %w", c.what, err)
			}
		}
		if err := sameTx(ctx, tx, c.what, c.sql, live, b.contributions()); err != nil {
			return err
		}
	}
	return nil
}

// sameTx fails with a *ChangedError unless query describes live and build
// alike.
func sameTx(ctx context.Context, tx *sqlx.Tx, what, query, live, build string) error {
	var l, n string
	if err := tx.GetContext(ctx, &l, query, live); err != nil {
		return fmt.Errorf("describe the live replica's %s: %w", what, err)
	}
	if err := tx.GetContext(ctx, &n, query, build); err != nil {
		return fmt.Errorf("describe the new replica's %s: %w", what, err)
	}
	if l != n {
		return &ChangedError{What: what, Live: l, Build: n}
	}
	return nil
}

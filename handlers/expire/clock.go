package expire

import (
	"context"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
)

// databaseNow is PostgreSQL's clock, the one clock every expirer instance
// shares: AsOf comes from it, never from the process, so that an instance
// whose clock runs ahead does not expire a purchase before its EndsAt (time
// the customer paid for), and one whose clock runs behind does not expire it
// late. EndsAt is stored by the same server, at its precision (microseconds).
func databaseNow(ctx context.Context, q sqlx.QueryerContext) (time.Time, error) {
	var now time.Time
	if err := sqlx.GetContext(ctx, q, &now, `SELECT now()`); err != nil {
		return time.Time{}, fmt.Errorf("read the database's clock: %w", err)
	}
	return now.UTC(), nil
}

package boost

import (
	"errors"
	"fmt"
	"testing"

	"github.com/lib/pq"
	"github.com/lib/pq/pqerror"
	"github.com/stretchr/testify/require"
)

func TestWrap_DeadlockAndSerializationFailureAreErrConflict(t *testing.T) {
	for _, code := range []pqerror.Code{pqerror.TRDeadlockDetected, pqerror.TRSerializationFailure} {
		err := wrap("recompute cards", fmt.Errorf("driver: %w", &pq.Error{Code: code}))
		require.ErrorIs(t, err, ErrConflict, code)
	}
	for _, err := range []error{&pq.Error{Code: pqerror.UniqueViolation}, errors.New("connection reset")} {
		require.NotErrorIs(t, wrap("recompute cards", err), ErrConflict)
	}
}

func TestWrap_LockTimeoutIsErrConflictAndFullLockTableIsNot(t *testing.T) {
	// 55P03 lock_not_available (lock_timeout): a re-read can pass once the
	// other writer commits. 53200 out of shared memory is the server's
	// resource, not a clash: the consumer backs off and never dead-letters it.
	for _, code := range []pqerror.Code{pqerror.LockNotAvailable} {
		err := wrap("take advisory locks", fmt.Errorf("driver: %w", &pq.Error{Code: code}))
		require.ErrorIs(t, err, ErrConflict, code)
		var pqErr *pq.Error
		require.ErrorAs(t, err, &pqErr, "the driver's error stays in the chain")
		require.Equal(t, code, pqErr.Code)
	}
	for _, code := range []pqerror.Code{pqerror.OutOfMemory, pqerror.DiskFull, pqerror.TooManyConnections, pqerror.QueryCanceled} {
		require.NotErrorIs(t, wrap("apply contributions", &pq.Error{Code: code}), ErrConflict, code)
	}
}

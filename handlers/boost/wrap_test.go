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

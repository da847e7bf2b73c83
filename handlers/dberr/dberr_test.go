package dberr_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/lib/pq"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/dberr"
)

// TestClassify_ReadOnlyBySQLSTATEAndRecovery: 25006 is always a refused
// write; 0A000 only from a server in recovery (a standby's answer to BEGIN
// READ WRITE), and a fault elsewhere; a bug is neither.
func TestClassify_ReadOnlyBySQLSTATEAndRecovery(t *testing.T) {
	ctx := context.Background()
	standby := func(context.Context) (bool, error) { return true, nil }
	primary := func(context.Context) (bool, error) { return false, nil }
	readOnly := fmt.Errorf("begin: %w", &pq.Error{Code: "25006"})
	notSupported := fmt.Errorf("begin: %w", &pq.Error{Code: "0A000"})

	require.ErrorIs(t, dberr.Classify(ctx, readOnly, primary), dberr.ErrReadOnly)
	require.ErrorIs(t, dberr.Classify(ctx, notSupported, standby), dberr.ErrReadOnly)
	require.NotErrorIs(t, dberr.Classify(ctx, notSupported, primary), dberr.ErrReadOnly)
	require.NotErrorIs(t, dberr.Classify(ctx, notSupported, nil), dberr.ErrReadOnly)
	require.Equal(t, dberr.ReasonOther, dberr.Reason(dberr.Classify(ctx, notSupported, primary)))
	require.Equal(t, dberr.ReasonReadOnly, dberr.Reason(readOnly))
	require.Equal(t, dberr.ReasonUnavailable, dberr.Reason(&pq.Error{Code: "57P01"}))
	require.Equal(t, dberr.ReasonOther, dberr.Reason(errors.New("a bug")))

	var changes []bool
	w := &dberr.Watch{OnChange: func(refused bool, _ error) { changes = append(changes, refused) }}
	for _, err := range []error{readOnly, readOnly, errors.New("a bug"), readOnly, nil, nil, readOnly} {
		w.Observe(err)
	}
	require.Equal(t, []bool{true, false, true}, changes, "once on each change, other errors left out")
}

package middleware_test

import (
	"log/slog"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/logtest"
	"github.com/promoflow/promoflow/middleware"
)

type contractVersionBundle struct {
	logs       *logtest.Logs
	mismatches prometheus.Counter
	handled    int
	handle     message.HandlerFunc
}

func setupContractVersion(t *testing.T) *contractVersionBundle {
	t.Helper()
	t.Parallel()
	b := &contractVersionBundle{
		logs: &logtest.Logs{},
		mismatches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "catalog_promotion_contract_mismatch_total",
		}),
	}
	b.handle = middleware.ContractVersion(event.ContractVersion, b.mismatches, b.logs.Logger())(
		func(*message.Message) ([]*message.Message, error) {
			b.handled++
			return nil, nil
		})
	return b
}

func TestContractVersion_MismatchWarnsAndProceeds(t *testing.T) {
	b := setupContractVersion(t)
	msg := newMessage(t)
	msg.Metadata.Set(event.HeaderContractVersion, "2")

	_, err := b.handle(msg)

	require.NoError(t, err)
	require.Equal(t, 1, b.handled, "the message proceeds to the handler")
	require.InDelta(t, 1, testutil.ToFloat64(b.mismatches), 0)
	warns := b.logs.Find(slog.LevelWarn, "contract version mismatch")
	require.Len(t, warns, 1)
	require.Equal(t, msg.UUID, warns[0]["MessageId"])
	require.Equal(t, "1", warns[0]["expectedVersion"])
	require.Equal(t, "2", warns[0]["gotVersion"])
}

func TestContractVersion_MissingHeaderWarnsAndProceeds(t *testing.T) {
	b := setupContractVersion(t)
	msg := newMessage(t)
	delete(msg.Metadata, event.HeaderContractVersion)

	_, err := b.handle(msg)

	require.NoError(t, err)
	require.Equal(t, 1, b.handled)
	require.InDelta(t, 1, testutil.ToFloat64(b.mismatches), 0)
	warns := b.logs.Find(slog.LevelWarn, "contract version mismatch")
	require.Len(t, warns, 1)
	require.Equal(t, "false", warns[0]["headerPresent"])
}

func TestContractVersion_ExpectedVersionIsSilent(t *testing.T) {
	b := setupContractVersion(t)

	_, err := b.handle(newMessage(t))

	require.NoError(t, err)
	require.Equal(t, 1, b.handled)
	require.Zero(t, testutil.ToFloat64(b.mismatches))
	require.Empty(t, b.logs.Find(slog.LevelWarn, "contract version mismatch"))
}

package middleware

import (
	"cmp"
	"log/slog"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/promoflow/promoflow/handlers/event"
)

// ContractVersion warns about a message whose contract_version header differs
// from expected or is missing, counts it in mismatches (the caller's
// catalog_promotion_contract_mismatch_total; nil counts nothing), and proceeds:
// the seed's rule is warn-and-proceed, and the payload's own validation decides
// whether the event is usable. A nil log means slog.Default().
func ContractVersion(expected string, mismatches prometheus.Counter, log *slog.Logger) message.HandlerMiddleware {
	log = cmp.Or(log, slog.Default())
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			got, ok := msg.Metadata[event.HeaderContractVersion]
			if !ok || got != expected {
				log.WarnContext(msg.Context(), "contract version mismatch",
					"MessageId", msg.UUID,
					"PurchaseId", msg.Metadata.Get(event.HeaderAggregateID),
					"expectedVersion", expected,
					"gotVersion", got,
					"headerPresent", ok)
				if mismatches != nil {
					mismatches.Inc()
				}
			}
			return h(msg)
		}
	}
}

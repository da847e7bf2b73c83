package rebuild

import (
	"fmt"
	"strings"

	"github.com/promoflow/promoflow/router/bounded"
	"github.com/promoflow/promoflow/router/kafkakit"
)

// IncompleteError is a topic that no longer holds every purchase's latest
// event: a partition's earliest offset is above 0 and the topic is not a
// compacted changelog, so retention (or DeleteRecords) removed records that a
// rebuild would need. The rebuild refuses before it builds anything.
type IncompleteError struct {
	Topic     string
	Partition int32
	Earliest  int64
	Policies  []string
}

func (e *IncompleteError) Error() string {
	return fmt.Sprintf("topic %s cannot give back every purchase: partition %d starts at offset %d (earlier records were "+
		"deleted) and its cleanup.policy is %q, not compact; nothing was changed. Make the topic a compacted changelog "+
		"(cleanup.policy=compact) and let the producers republish, or restore the records first",
		e.Topic, e.Partition, e.Earliest, strings.Join(e.Policies, ","))
}

// check refuses a topic from which a replay cannot restore everything.
func check(c *bounded.Client, topic string) error {
	parts, err := c.Partitions(topic)
	if err != nil {
		return err
	}
	admin, err := c.Admin()
	if err != nil {
		return err
	}
	policies, err := kafkakit.CleanupPolicies(admin, topic)
	if err != nil {
		return err
	}
	if kafkakit.OnlyCompacted(policies) {
		return nil
	}
	for _, p := range parts {
		if p.Oldest > 0 {
			return &IncompleteError{Topic: topic, Partition: p.Partition, Earliest: p.Oldest, Policies: policies}
		}
	}
	return nil
}

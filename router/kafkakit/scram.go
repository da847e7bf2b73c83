package kafkakit

import (
	"crypto/sha256"
	"crypto/sha512"

	"github.com/IBM/sarama"
	"github.com/xdg-go/scram"
)

// scramClient is the SCRAM conversation Sarama runs for a SCRAM mechanism
// (Sarama brings none of its own), or nil for another mechanism.
func scramClient(mechanism string) func() sarama.SCRAMClient {
	var hash scram.HashGeneratorFcn
	switch mechanism {
	case MechanismSCRAMSHA256:
		hash = sha256.New
	case MechanismSCRAMSHA512:
		hash = sha512.New
	default:
		return nil
	}
	return func() sarama.SCRAMClient { return &scramConversation{hash: hash} }
}

// scramConversation adapts xdg-go/scram to sarama.SCRAMClient.
type scramConversation struct {
	hash scram.HashGeneratorFcn
	conv *scram.ClientConversation
}

func (s *scramConversation) Begin(user, password, authzID string) error {
	client, err := s.hash.NewClient(user, password, authzID)
	if err != nil {
		return err
	}
	s.conv = client.NewConversation()
	return nil
}

func (s *scramConversation) Step(challenge string) (string, error) { return s.conv.Step(challenge) }

func (s *scramConversation) Done() bool { return s.conv.Done() }

package expire_test

import (
	"github.com/google/uuid"
	"github.com/lib/pq"
)

func pqArray(ids []uuid.UUID) any {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = id.String()
	}
	return pq.Array(s)
}

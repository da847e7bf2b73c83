package kafkakit

// Remembered is how many acknowledged messages r keeps for its next call.
func (r *Resender) Remembered() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.acked)
}

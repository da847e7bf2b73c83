package dberr

import "sync"

// Watch follows one component's "the database takes no writes" state, so
// that the component says so once when it enters the state and once when it
// leaves it, instead of an error on every refused attempt (each second for
// the relay while a standby stands at the primary's address).
type Watch struct {
	// OnChange is called on each change: refused with the refusal, then
	// writable again with a nil error. Calls are serialised.
	OnChange func(refused bool, err error)

	mu      sync.Mutex
	refused bool
}

// Observe records the outcome of one attempt that writes: a read-only
// refusal (ReadOnly) enters the state, and a success leaves it. Any other
// error says nothing about it and is left to the caller.
func (w *Watch) Observe(err error) {
	if err != nil && !ReadOnly(err) {
		return
	}
	refused := err != nil
	w.mu.Lock()
	defer w.mu.Unlock()
	if refused == w.refused {
		return
	}
	w.refused = refused
	if w.OnChange != nil {
		w.OnChange(refused, err)
	}
}

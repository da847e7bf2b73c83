package rebuild

import "context"

// Hooks are the rebuild's test seams (see hooks).
type Hooks struct {
	AfterCheck, InReset, BeforeReplay func(context.Context) error
}

// SetHooks sets the test seams.
func (r *Rebuilder) SetHooks(h Hooks) {
	r.hooks = hooks{afterCheck: h.AfterCheck, inReset: h.InReset, beforeReplay: h.BeforeReplay}
}

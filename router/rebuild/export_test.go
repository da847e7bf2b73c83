package rebuild

import "context"

// SetHooks sets the test seams: afterCheck runs after the topic check and
// before the reset, beforeReplay after the end offsets were read.
func (r *Rebuilder) SetHooks(afterCheck, beforeReplay func(context.Context) error) {
	r.afterCheck, r.beforeReplay = afterCheck, beforeReplay
}

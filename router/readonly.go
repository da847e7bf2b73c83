package router

import "log/slog"

// readOnlyLog is a dberr.Watch's OnChange that logs a component's read-only
// spell: a warning when it starts, naming what the component stops doing,
// and a line when it ends.
func readOnlyLog(log *slog.Logger, component, consequence string) func(bool, error) {
	return func(refused bool, err error) {
		if refused {
			log.Warn("the database takes no writes: "+component+" paused", "component", component,
				"consequence", consequence, "error", err.Error())
			return
		}
		log.Info("the database takes writes again: "+component+" resumes", "component", component)
	}
}

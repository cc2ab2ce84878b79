package dispatch

// SetCrashAfterWrite makes d simulate a crash between storing a run's
// state and publishing its outbox whenever f returns true.
func SetCrashAfterWrite(d *Dispatcher, f func(runID string) bool) { d.crashAfterWrite = f }

// SetCrashHoldingAlarm makes d simulate a crash while it holds a new run's
// alarm whenever f returns true: the alarm is never armed and the run's
// request is handed back.
func SetCrashHoldingAlarm(d *Dispatcher, f func(runID string) bool) { d.deferred.crash = f }

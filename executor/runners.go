package executor

// runners run handlers on goroutines that outlive one call: a goroutine
// started per call grew a fresh stack every time (decoding the input,
// validation and the handler itself recurse), which the profile showed
// costing about a tenth of an executor's CPU on small actions. A runner
// that finished a call waits for the next one; there are never more than
// the most handlers that ran at once (the slots, plus handlers abandoned
// past their deadline that have not returned yet).
type runners struct {
	tasks chan func()   // unbuffered: a send succeeds only into an idle runner
	done  chan struct{} // closed by stop: idle runners exit
}

func newRunners() *runners {
	return &runners{tasks: make(chan func()), done: make(chan struct{})}
}

// run starts fn on an idle runner, or on a new one when none is idle. It
// never waits for fn.
func (r *runners) run(fn func()) {
	select {
	case r.tasks <- fn:
	default:
		go r.loop(fn)
	}
}

func (r *runners) loop(fn func()) {
	for {
		fn()
		select {
		case fn = <-r.tasks:
		case <-r.done:
			return
		}
	}
}

// stop ends idle runners, and each busy one when its call returns; run
// still works after it (on a goroutine of its own).
func (r *runners) stop() { close(r.done) }

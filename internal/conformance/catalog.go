package conformance

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/actionbus/actionbus/executor"
)

// The conformance catalog: the actions an executor under test hosts on
// its pool, which the kit drives (docs/protocol.md names the same five).
const (
	// ActionEcho (read) returns its input {text} as its output.
	ActionEcho = "conformance.echo"
	// ActionSleep (read, timeout 1 s) waits {ms} milliseconds, honouring
	// cancellation, and returns {slept: ms}.
	ActionSleep = "conformance.sleep"
	// ActionBig (read) returns {data} of {bytes} "x" characters.
	ActionBig = "conformance.big"
	// ActionIncrement (mutate) increments an in-memory counter of {key}
	// and returns {count}: a replay is visible, as the count does not move.
	ActionIncrement = "conformance.increment"
	// ActionShape (read) returns the object {output} of its input as its
	// output, which its output schema checks ({count: integer, name:
	// string}, both required): the kit makes it return output that fails
	// (E-OUTPUT).
	ActionShape = "conformance.shape"
)

// Catalog is the conformance catalog's action names, in the order
// docs/protocol.md lists them.
var Catalog = []string{ActionEcho, ActionSleep, ActionBig, ActionIncrement, ActionShape}

// SleepTimeout is conformance.sleep's declared timeout.
const SleepTimeout = time.Second

// Input schemas of the catalog, as common to every SDK.
var (
	echoInput      = []byte(`{"type":"object","properties":{"text":{"type":"string","maxLength":1000}},"required":["text"],"additionalProperties":false}`)
	sleepInput     = []byte(`{"type":"object","properties":{"ms":{"type":"integer","minimum":0,"maximum":60000}},"required":["ms"],"additionalProperties":false}`)
	bigInput       = []byte(`{"type":"object","properties":{"bytes":{"type":"integer","minimum":1,"maximum":4194304}},"required":["bytes"],"additionalProperties":false}`)
	incrementInput = []byte(`{"type":"object","properties":{"key":{"type":"string"}},"required":["key"],"additionalProperties":false}`)
	shapeInput     = []byte(`{"type":"object","properties":{"output":{"type":"object"}},"required":["output"],"additionalProperties":false}`)
	shapeOutput    = []byte(`{"type":"object","properties":{"count":{"type":"integer"},"name":{"type":"string"}},"required":["count","name"]}`)
)

type echoIO struct {
	Text string `json:"text"`
}

type sleepIn struct {
	Ms int `json:"ms"`
}

type sleepOut struct {
	Slept int `json:"slept"`
}

type bigIn struct {
	Bytes int `json:"bytes"`
}

type bigOut struct {
	Data string `json:"data"`
}

type incrementIn struct {
	Key string `json:"key"`
}

type incrementOut struct {
	Count int `json:"count"`
}

type shapeIn struct {
	Output map[string]any `json:"output"`
}

// RegisterCatalog registers the conformance catalog on ex, so that the
// Go executor can be driven by `actionbus conformance executor`. Its
// counters live in memory, per call of RegisterCatalog.
func RegisterCatalog(ex *executor.Executor) error {
	var mu sync.Mutex
	counts := map[string]int{}
	if err := executor.Register(ex, executor.Action{Name: ActionEcho, Description: "Conformance: returns its text.", InputSchema: echoInput},
		func(_ context.Context, in echoIO, _ executor.Call) (executor.Result[echoIO], error) {
			return executor.Result[echoIO]{Output: in, Summary: "echoed"}, nil
		}); err != nil {
		return err
	}
	if err := executor.Register(ex, executor.Action{Name: ActionSleep, Description: "Conformance: waits ms milliseconds.", InputSchema: sleepInput, Timeout: SleepTimeout},
		func(ctx context.Context, in sleepIn, _ executor.Call) (executor.Result[sleepOut], error) {
			t := time.NewTimer(time.Duration(in.Ms) * time.Millisecond)
			defer t.Stop()
			select {
			case <-t.C:
				return executor.Result[sleepOut]{Output: sleepOut{Slept: in.Ms}, Summary: "slept"}, nil
			case <-ctx.Done():
				return executor.Result[sleepOut]{}, ctx.Err()
			}
		}); err != nil {
		return err
	}
	if err := executor.Register(ex, executor.Action{Name: ActionBig, Description: "Conformance: returns bytes x characters.", InputSchema: bigInput},
		func(_ context.Context, in bigIn, _ executor.Call) (executor.Result[bigOut], error) {
			return executor.Result[bigOut]{Output: bigOut{Data: strings.Repeat("x", in.Bytes)}, Summary: "big"}, nil
		}); err != nil {
		return err
	}
	if err := executor.Register(ex, executor.Action{Name: ActionShape, Description: "Conformance: returns the object output of its input, checked by its output schema.",
		InputSchema: shapeInput, OutputSchema: shapeOutput},
		func(_ context.Context, in shapeIn, _ executor.Call) (executor.Result[map[string]any], error) {
			return executor.Result[map[string]any]{Output: in.Output, Summary: "shaped"}, nil
		}); err != nil {
		return err
	}
	return executor.Register(ex, executor.Action{Name: ActionIncrement, Description: "Conformance: increments the counter of key.", Mode: executor.ModeMutate, InputSchema: incrementInput},
		func(_ context.Context, in incrementIn, _ executor.Call) (executor.Result[incrementOut], error) {
			mu.Lock()
			defer mu.Unlock()
			counts[in.Key]++
			return executor.Result[incrementOut]{Output: incrementOut{Count: counts[in.Key]}, Summary: "incremented"}, nil
		})
}

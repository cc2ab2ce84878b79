// Command testexecutor is an executor for the process tests: its actions
// record every invocation in files, so a test can count handler runs
// across processes that are killed.
//
//	test.slow   sleeps SLOW_MS (default 300) milliseconds, honoring its context
//	test.count  (mutate) increments a counter file; with {"useKey": true} it
//	            applies each idempotency key once; with CRASH_AFTER_EFFECT=1
//	            the process kills itself right after the effect
//	test.secret returns a private output; its password input must be
//	            lower-case letters (a schema pattern)
//	test.other  records that it ran and returns {"ok": true}
//	test.huge   fails with a 2 MB error message (over the server's max
//	            payload)
//	test.limited sleeps 300 ms; at most 2 run at once per {"key": ...}
//	            across every process; appends "<key> <start ns> <end ns>" to
//	            TEST_DIR/limited
//	billing.lookup (only with POOL set to a pool other than "default",
//	            then the only action) answers {"servedBy": POOL}
//	test.rated  at most 5 start per second (burst 1) across every process;
//	            appends its start time (ns) to TEST_DIR/rated
//	soak.effect (mutate) applies the business effect {"order": ...} of its
//	            run once per idempotency key, in a store outside the bus:
//	            TEST_DIR/effects holds one file per applied key whose
//	            content is "<run id>/<order>", created atomically, as a
//	            database's unique key would be
//
// With BROKEN=1 it is instead a deliberately broken executor of POOL
// (broken.go), which the conformance kit must fail.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/actionbus/actionbus/executor"
)

type slowIn struct {
	N int `json:"n"`
}

type countIn struct {
	UseKey bool `json:"useKey"`
}

func appendLine(path, line string) {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		panic(err)
	}
	defer f.Close()
	fmt.Fprintln(f, line)
	_ = f.Sync()
}

func main() {
	dir := os.Getenv("TEST_DIR")
	id := os.Getenv("ACTIONBUS_EXECUTOR_ID")
	slowMS, _ := strconv.Atoi(os.Getenv("SLOW_MS"))
	if slowMS == 0 {
		slowMS = 300
	}
	slots, _ := strconv.Atoi(os.Getenv("SLOTS"))
	grace, _ := time.ParseDuration(os.Getenv("GRACE"))
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	opts := []nats.Option{nats.CustomInboxPrefix("_INBOX_executor")}
	if creds := os.Getenv("NATS_CREDS"); creds != "" {
		opts = append(opts, nats.UserCredentials(creds))
	}
	nc, err := nats.Connect(os.Getenv("NATS_URL"), opts...)
	if err != nil {
		panic(err)
	}
	defer nc.Close()
	pool := os.Getenv("POOL")
	if os.Getenv("BROKEN") == "1" {
		if err := serveBroken(ctx, nc, pool); err != nil {
			log.Error("broken executor stopped", "err", err)
			os.Exit(1)
		}
		return
	}
	ex, err := executor.New(nc, executor.Config{ID: id, Pool: pool, Slots: slots, ShutdownGrace: grace, Logger: log,
		JetStreamDomain: os.Getenv("ACTIONBUS_JS_DOMAIN")})
	if err != nil {
		panic(err)
	}
	must := func(err error) {
		if err != nil {
			panic(err)
		}
	}
	if pool != "" && pool != "default" {
		// Another pool hosts one action of its own, which answers with
		// its pool's name.
		must(executor.Register(ex, executor.Action{Name: "billing.lookup", Timeout: time.Second},
			func(context.Context, struct{}, executor.Call) (executor.Result[map[string]string], error) {
				return executor.Result[map[string]string]{Output: map[string]string{"servedBy": pool}}, nil
			}))
		if err := ex.Run(ctx); err != nil {
			log.Error("executor stopped", "err", err)
			os.Exit(1)
		}
		return
	}
	must(executor.Register(ex, executor.Action{Name: "test.slow", Timeout: 20 * time.Second},
		func(ctx context.Context, in slowIn, call executor.Call) (executor.Result[slowIn], error) {
			appendLine(filepath.Join(dir, "invocations"), id+" "+call.CallID)
			t := time.NewTimer(time.Duration(slowMS) * time.Millisecond)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
				return executor.Result[slowIn]{}, ctx.Err()
			}
			appendLine(filepath.Join(dir, "completions"), id+" "+call.CallID)
			return executor.Result[slowIn]{Output: in, Summary: "slept on " + id}, nil
		}))
	must(executor.Register(ex, executor.Action{Name: "test.count", Mode: executor.ModeMutate, Timeout: time.Second},
		func(ctx context.Context, in countIn, call executor.Call) (executor.Result[countIn], error) {
			keys := filepath.Join(dir, "applied-keys")
			if in.UseKey {
				seen, _ := os.ReadFile(keys)
				if strings.Contains(string(seen), call.IdempotencyKey+"\n") {
					return executor.Result[countIn]{Output: in, Summary: "already applied"}, nil
				}
			}
			appendLine(filepath.Join(dir, "counter"), "+1 by "+id)
			appendLine(keys, call.IdempotencyKey)
			if os.Getenv("CRASH_AFTER_EFFECT") == "1" {
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {}
			}
			return executor.Result[countIn]{Output: in, Summary: "counted"}, nil
		}))
	type anyOut = map[string]any
	must(executor.Register(ex, executor.Action{Name: "test.secret", Timeout: time.Second,
		InputSchema: []byte(`{"type":"object","properties":{"password":{"type":"string","pattern":"^[a-z]+$"}},"additionalProperties":false}`)},
		func(ctx context.Context, in map[string]any, call executor.Call) (executor.Result[anyOut], error) {
			appendLine(filepath.Join(dir, "invocations"), "secret "+call.UserID)
			return executor.Result[anyOut]{Output: anyOut{"secret": "u1-private-output"}, Summary: "secret"}, nil
		}))
	must(executor.Register(ex, executor.Action{Name: "test.other", Timeout: time.Second},
		func(ctx context.Context, in map[string]any, call executor.Call) (executor.Result[anyOut], error) {
			appendLine(filepath.Join(dir, "invocations"), "other "+call.UserID)
			return executor.Result[anyOut]{Output: anyOut{"ok": true}}, nil
		}))
	// test.big returns an output of "bytes" bytes (at most 4 MiB): one
	// over MaxOutputBytes is stored as an artifact of the run's tenant.
	type bigIn struct {
		Bytes int `json:"bytes"`
	}
	must(executor.Register(ex, executor.Action{Name: "test.big", Timeout: 5 * time.Second},
		func(ctx context.Context, in bigIn, call executor.Call) (executor.Result[anyOut], error) {
			return executor.Result[anyOut]{Output: anyOut{"text": strings.Repeat("b", min(max(in.Bytes, 0), 4<<20))}}, nil
		}))
	must(executor.Register(ex, executor.Action{Name: "test.huge", Timeout: 5 * time.Second},
		func(ctx context.Context, in map[string]any, call executor.Call) (executor.Result[anyOut], error) {
			return executor.Result[anyOut]{}, fmt.Errorf("%s", strings.Repeat("x", 2<<20))
		}))
	type keyIn struct {
		Key string `json:"key"`
	}
	must(executor.Register(ex, executor.Action{Name: "test.limited", Timeout: 5 * time.Second,
		Limits: &executor.Limits{Key: "{{.input.key}}", MaxInFlight: 2}},
		func(ctx context.Context, in keyIn, call executor.Call) (executor.Result[keyIn], error) {
			start := time.Now()
			select {
			case <-time.After(300 * time.Millisecond):
			case <-ctx.Done():
				return executor.Result[keyIn]{}, ctx.Err()
			}
			appendLine(filepath.Join(dir, "limited"), fmt.Sprintf("%s %d %d", in.Key, start.UnixNano(), time.Now().UnixNano()))
			return executor.Result[keyIn]{Output: in}, nil
		}))
	must(executor.Register(ex, executor.Action{Name: "test.rated", Timeout: 5 * time.Second,
		Limits: &executor.Limits{Rate: &executor.Rate{Limit: 5, PerMs: 1000, Burst: 1}}},
		func(ctx context.Context, in map[string]any, call executor.Call) (executor.Result[anyOut], error) {
			appendLine(filepath.Join(dir, "rated"), strconv.FormatInt(time.Now().UnixNano(), 10))
			return executor.Result[anyOut]{Output: anyOut{"ok": true}}, nil
		}))
	type effectIn struct {
		Order string `json:"order"`
	}
	must(os.MkdirAll(filepath.Join(dir, "effects"), 0o700))
	must(executor.Register(ex, executor.Action{Name: "soak.effect", Mode: executor.ModeMutate, Timeout: 5 * time.Second},
		func(ctx context.Context, in effectIn, call executor.Call) (executor.Result[anyOut], error) {
			business := call.RunID + "/" + in.Order
			sum := sha256.Sum256([]byte(call.IdempotencyKey))
			marker := filepath.Join(dir, "effects", hex.EncodeToString(sum[:]))
			tmp, err := os.CreateTemp(dir, "effect-*")
			if err != nil {
				return executor.Result[anyOut]{}, err
			}
			defer os.Remove(tmp.Name())
			if _, err := tmp.WriteString(business); err != nil {
				return executor.Result[anyOut]{}, err
			}
			if err := tmp.Sync(); err != nil {
				return executor.Result[anyOut]{}, err
			}
			_ = tmp.Close()
			// The link creates the marker with its content in one step,
			// and fails when the key was applied before.
			if err := os.Link(tmp.Name(), marker); errors.Is(err, fs.ErrExist) {
				return executor.Result[anyOut]{Output: anyOut{"applied": false}, Summary: "already applied"}, nil
			} else if err != nil {
				return executor.Result[anyOut]{}, err
			}
			return executor.Result[anyOut]{Output: anyOut{"applied": true}, Summary: "applied " + in.Order}, nil
		}))
	if err := ex.Run(ctx); err != nil {
		log.Error("run", "err", err)
		os.Exit(1)
	}
}

// Command actionbus is the actionbus command line: dev, provision, run,
// exec, watch, cancel, actions and events tail. See `actionbus --help`.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/actionbus/actionbus/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Execute(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

package client

// LoseLive makes c lose the live messages of Follow that drop returns
// true for, as a connection moving to another server does.
func LoseLive(c *Client, drop func(subject string) bool) { c.dropLive = drop }

// FirstDifference exposes firstDifference to the tests.
func FirstDifference(a, b any) (Divergence, bool) { return firstDifference(a, b) }

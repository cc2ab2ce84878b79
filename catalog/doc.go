// Package catalog holds what an executor declares about the actions and
// skills it hosts, as they are announced to the catalog and stored there:
// an action's mode, planner metadata, permission metadata, audit policy,
// examples and limits, and a bundled skill with its tools. The executor
// package names these types for its definitions (executor.Definition),
// and the client package for what it reads back from the catalog
// (client.ActionInfo, client.Skill); their JSON form is the one of
// schemas/ and of docs/protocol.md, for executors in other languages.
//
// The package holds data and the pure rules over it (defaults, validation,
// a limit's key); it talks to no server.
package catalog

// Package tutorialtest keeps docs/first-job.md true: its test builds the
// tutorial's files as an outside module (its own go.mod, batchmr replaced
// by this repository), runs the worker it defines twice, and runs the
// scheduler commands the tutorial shows against them, on real servers.
// It holds no code of its own.
package tutorialtest

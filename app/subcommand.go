package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

// action splits the args of a command that takes an action first (promoflow
// outbox drain|thaw, promoflow dlq list|...): help prints usage to stdout
// (flag.ErrHelp, exit 0), and a missing or unknown action prints it to
// stderr and fails.
func action(command string, args, actions []string, usage string) (string, []string, error) {
	if len(args) > 0 && slices.Contains(actions, args[0]) {
		return args[0], args[1:], nil
	}
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
		fmt.Fprint(os.Stdout, usage)
		return "", nil, flag.ErrHelp
	}
	fmt.Fprint(os.Stderr, usage)
	last := len(actions) - 1
	return "", nil, fmt.Errorf("%s: name %s or %s", command, strings.Join(actions[:last], ", "), actions[last])
}

// parseHelpToStdout parses args; --help goes to stdout (exit 0), and an
// error goes to stderr through main.
func parseHelpToStdout(s *settings, args []string) error {
	s.fs.SetOutput(io.Discard)
	err := s.parse(args)
	if errors.Is(err, flag.ErrHelp) {
		s.fs.SetOutput(os.Stdout)
		s.fs.Usage()
	}
	return err
}

package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/promoflow/promoflow/router/kafkakit"
)

// settings maps every flag to its environment variable in one place. A flag
// given on the command line wins over the variable, which wins over the default.
type settings struct {
	fs      *flag.FlagSet
	envs    map[string]string // flag name → env var
	negates map[string]string // --no-x → x (negation)
}

func newSettings(name, summary string) *settings {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	s := &settings{fs: fs, envs: map[string]string{}, negates: map[string]string{}}
	fs.Usage = func() {
		out := fs.Output()
		fmt.Fprintf(out, "Usage: promoflow %s [flags]\n\n%s\n\nSettings (flag, environment variable, default):\n", name, summary)
		fs.VisitAll(func(f *flag.Flag) {
			def := f.DefValue
			if def == "" {
				def = `""`
			}
			env := "$" + s.envs[f.Name]
			if s.envs[f.Name] == "" {
				env = "(flag only)"
			}
			fmt.Fprintf(out, "  --%-32s %-34s default %s\n      %s\n", f.Name, env, def, f.Usage)
		})
	}
	return s
}

func (s *settings) str(p *string, name, env, def, usage string) {
	s.fs.StringVar(p, name, def, usage)
	s.envs[name] = env
}

func (s *settings) int(p *int, name, env string, def int, usage string) {
	s.fs.IntVar(p, name, def, usage)
	s.envs[name] = env
}

func (s *settings) dur(p *time.Duration, name, env string, def time.Duration, usage string) {
	s.fs.DurationVar(p, name, def, usage)
	s.envs[name] = env
}

// notBool binds a flag whose value is the negation of *p: a component's
// DisableX field shown to operators as the X they switch on or off.
func (s *settings) notBool(p *bool, name, env string, def bool, usage string) {
	*p = !def
	s.fs.Var((*notBoolValue)(p), name, usage)
	s.fs.Lookup(name).DefValue = strconv.FormatBool(def)
	s.envs[name] = env
}

type notBoolValue bool

func (v *notBoolValue) String() string { return strconv.FormatBool(!bool(*v)) }

func (v *notBoolValue) Set(s string) error {
	b, err := strconv.ParseBool(s)
	if err != nil {
		return err
	}
	*v = notBoolValue(!b)
	return nil
}

// IsBoolFlag lets --name stand for --name=true.
func (v *notBoolValue) IsBoolFlag() bool { return true }

func (s *settings) float(p *float64, name, env string, def float64, usage string) {
	s.fs.Float64Var(p, name, def, usage)
	s.envs[name] = env
}

// value binds a setting parsed by its own type (a flag.Value); its default
// is what p holds at registration.
func (s *settings) value(p flag.Value, name, env, usage string) {
	s.fs.Var(p, name, usage)
	s.envs[name] = env
}

func (s *settings) bool(p *bool, name, env string, def bool, usage string) {
	s.fs.BoolVar(p, name, def, usage)
	s.envs[name] = env
}

// parse reads args, then fills every flag not given from its environment
// variable. --help prints the settings to stdout (flag.ErrHelp: exit 0); an
// error goes to stderr through main, naming --help.
func (s *settings) parse(args []string) error {
	s.fs.SetOutput(io.Discard)
	if err := s.fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			s.fs.SetOutput(os.Stdout)
			s.fs.Usage()
			return err
		}
		return fmt.Errorf("%w (promoflow %s --help lists the settings)", err, s.fs.Name())
	}
	if s.fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %s", strings.Join(s.fs.Args(), " "))
	}
	given := map[string]bool{}
	s.fs.Visit(func(f *flag.Flag) {
		given[f.Name] = true
		if of, ok := s.negates[f.Name]; ok {
			given[of] = true
		}
	})
	var errs []error
	s.fs.VisitAll(func(f *flag.Flag) {
		env := s.envs[f.Name]
		val, ok := os.LookupEnv(env)
		if given[f.Name] || !ok || env == "" {
			return
		}
		if err := s.fs.Set(f.Name, val); err != nil {
			errs = append(errs, fmt.Errorf("$%s=%q: %w", env, val, err))
		}
	})
	return errors.Join(errs...)
}

// negation binds --name, on the command line only, as the negation of the
// bool flag of: --no-demo is --demo=false, and wins over $PROMOFLOW_DEMO as
// --demo would.
func (s *settings) negation(name, of, usage string) {
	s.fs.Var(negationValue{s.fs.Lookup(of).Value}, name, usage)
	s.negates[name] = of
}

type negationValue struct{ of flag.Value }

func (v negationValue) String() string {
	if v.of == nil { // the zero value flag makes to print defaults
		return "false"
	}
	b, _ := strconv.ParseBool(v.of.String())
	return strconv.FormatBool(!b)
}

func (v negationValue) Set(s string) error {
	b, err := strconv.ParseBool(s)
	if err != nil {
		return err
	}
	return v.of.Set(strconv.FormatBool(!b))
}

// IsBoolFlag lets --no-x stand for --no-x=true.
func (v negationValue) IsBoolFlag() bool { return true }

// splitList splits a comma-separated setting, dropping blanks.
func splitList(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}

// flagGiven reports whether the flag was on the command line.
func flagGiven(s *settings, name string) bool {
	given := false
	s.fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

// parseCommand registers a command's settings, parses args onto them and
// validates the result.
func parseCommand(name, summary string, args []string, register func(*settings), validate func() error) error {
	s := newSettings(name, summary)
	register(s)
	if err := s.parse(args); err != nil {
		return err
	}
	return validate()
}

// secret binds a setting whose value never prints: --help shows no default,
// and a parse error never echoes it.
func (s *settings) secret(p *kafkakit.Secret, name, env, usage string) {
	s.fs.Var((*secretValue)(p), name, usage)
	s.envs[name] = env
}

type secretValue kafkakit.Secret

func (v *secretValue) String() string { return kafkakit.Secret(*v).String() }

func (v *secretValue) Set(s string) error {
	*v = secretValue(s)
	return nil
}

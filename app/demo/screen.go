package demo

import (
	"bytes"
	"fmt"
	"io"
	"slices"
	"sync"
	"unicode/utf8"
)

// Screen is a terminal with a live footer: what is written to it (log
// records, the demo's events) scrolls above as usual, and the footer, the live
// table, stays drawn below it. It redraws with two ANSI sequences (cursor up,
// erase below), which every terminal emulator and tmux understand.
type Screen struct {
	mu      sync.Mutex
	w       io.Writer
	width   int      // the terminal's columns; footer lines are cut to it, so that none wraps
	footer  []string // the footer as last set
	drawn   int      // lines of the footer on the terminal now
	partial []byte   // written text not yet ended by a line break
}

// NewScreen is a Screen on w, a terminal width columns wide (0: 80).
func NewScreen(w io.Writer, width int) *Screen {
	if width <= 0 {
		width = 80
	}
	return &Screen{w: w, width: width}
}

// Write writes p above the footer. A line not yet ended waits for its end,
// so that a footer never lands inside it.
func (s *Screen) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.partial = append(s.partial, p...)
	end := bytes.LastIndexByte(s.partial, '\n')
	if end < 0 {
		return len(p), nil
	}
	var buf bytes.Buffer
	s.erase(&buf)
	buf.Write(s.partial[:end+1])
	s.partial = append(s.partial[:0], s.partial[end+1:]...)
	s.draw(&buf)
	_, err := s.w.Write(buf.Bytes())
	return len(p), err
}

// SetFooter replaces the footer and redraws it when it changed.
func (s *Screen) SetFooter(lines []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if slices.Equal(s.footer, lines) && s.drawn == len(lines) {
		return
	}
	s.footer = lines
	var buf bytes.Buffer
	s.erase(&buf)
	s.draw(&buf)
	_, _ = s.w.Write(buf.Bytes())
}

// Close leaves the footer where it is, as the last table drawn, and writes
// what comes later below it.
func (s *Screen) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.footer, s.drawn = nil, 0
}

func (s *Screen) erase(buf *bytes.Buffer) {
	if s.drawn > 0 {
		fmt.Fprintf(buf, "\r\x1b[%dA\x1b[J", s.drawn) // up to the footer's first line, erase from there down
	}
	s.drawn = 0
}

func (s *Screen) draw(buf *bytes.Buffer) {
	for _, l := range s.footer {
		buf.WriteString(cut(l, s.width-1))
		buf.WriteByte('\n')
	}
	s.drawn = len(s.footer)
}

// cut shortens l to n characters.
func cut(l string, n int) string {
	if utf8.RuneCountInString(l) <= n {
		return l
	}
	return string([]rune(l)[:n])
}

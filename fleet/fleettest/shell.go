package fleettest

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strings"
)

// Command is one command of a Markdown shell block, as ShellBlock reads
// it: its words with quotes removed, a here-document's body, and the
// comment at its end.
type Command struct {
	// Line is the number of the Markdown file's line the command starts on
	// (from 1).
	Line int
	// Args are the command's words.
	Args []string
	// Stdin is the body of its here-document (<<'TAG' ... TAG), each line
	// ending in a newline; empty without one.
	Stdin string
	// Comment is what follows a '#' on its last line, trimmed.
	Comment string
}

// String is the command as a shell line (words quoted where they need
// it, the here-document left out), for messages.
func (c Command) String() string {
	q := make([]string, len(c.Args))
	for i, a := range c.Args {
		q[i] = a
		if a == "" || strings.ContainsAny(a, " \t\"'{}$\\*?[]|&;<>()#~`") {
			q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	s := strings.Join(q, " ")
	if c.Stdin != "" {
		s += " <<EOF"
	}
	return s
}

// Flag returns the value of flag name (with its dashes: "-n",
// "--kubeconfig") given as "name value" or "name=value", and whether it
// is there.
func (c Command) Flag(name string) (string, bool) {
	for i, a := range c.Args {
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v, true
		}
		if a == name && i+1 < len(c.Args) {
			return c.Args[i+1], true
		}
	}
	return "", false
}

// Words are the command's arguments after its program that are not
// flags nor the values of valueFlags given as "--flag value".
func (c Command) Words(valueFlags ...string) []string {
	var w []string
	for i := 1; i < len(c.Args); i++ {
		a := c.Args[i]
		if strings.HasPrefix(a, "-") && a != "-" {
			for _, f := range valueFlags {
				if a == f {
					i++
					break
				}
			}
			continue
		}
		w = append(w, a)
	}
	return w
}

// maxBlockLines bounds the shell block ShellBlock reads.
const maxBlockLines = 1000

// ShellBlock reads the first ```sh fenced block after the Markdown
// heading (a line of #s then text) that starts with heading in the file
// at path, and splits it into commands. It knows a small, literal part
// of the shell, enough for a README: words split by blanks, '...' and
// "..." quotes, a backslash before a line break (a continued line), a
// '#' comment, and here-documents (<<'TAG' or <<TAG). Anything whose
// meaning would take a shell (a pipe, ;, &&, a redirection, $, `...`,
// a glob, ~) is an error, as is a block that is not there: a test that
// runs a README's block fails when the block changes past what it can
// run, rather than running something else.
func ShellBlock(path, heading string) ([]Command, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	var lines []string
	first, n, state := 0, 0, 0 // 0: before the heading, 1: before the block, 2: in it
	for sc.Scan() {
		n++
		l := sc.Text()
		switch state {
		case 0:
			if t := strings.TrimLeft(l, "#"); t != l && strings.HasPrefix(strings.TrimSpace(t), heading) {
				state = 1
			}
		case 1:
			if strings.HasPrefix(l, "#") {
				return nil, fmt.Errorf("%s: no ```sh block under %q before the next heading (line %d)", path, heading, n)
			}
			if strings.TrimSpace(l) == "```sh" {
				state, first = 2, n+1
			}
		case 2:
			if strings.TrimSpace(l) == "```" {
				return parseShell(lines, first)
			}
			lines = append(lines, l)
			if len(lines) > maxBlockLines {
				return nil, fmt.Errorf("%s: the block under %q is longer than %d lines", path, heading, maxBlockLines)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if state == 2 {
		return nil, fmt.Errorf("%s: the block under %q does not end", path, heading)
	}
	return nil, fmt.Errorf("%s: no heading %q with a ```sh block", path, heading)
}

// errUnsupported marks shell syntax ShellBlock does not run.
var errUnsupported = errors.New("shell syntax this reader does not know (it runs literal commands only)")

// parseShell splits lines (the first is line first of the file) into
// commands.
func parseShell(lines []string, first int) ([]Command, error) {
	var cmds []Command
	for i := 0; i < len(lines); {
		line := i + first
		var (
			c       Command
			word    strings.Builder
			inWord  bool
			heredoc string // its tag, once seen
			quoted  bool   // the tag was quoted: no expansion in the body
		)
		flush := func() {
			if inWord {
				c.Args = append(c.Args, word.String())
				word.Reset()
				inWord = false
			}
		}
		// Read one command line, continued over backslash-newlines.
	scan:
		for {
			l := lines[i]
			i++
			for j := 0; j < len(l); j++ {
				ch := l[j]
				switch {
				case ch == ' ' || ch == '\t':
					flush()
				case ch == '\\':
					if j == len(l)-1 { // continued
						if i == len(lines) {
							return nil, fmt.Errorf("line %d: a backslash continues the block's last line", i+first-1)
						}
						flush()
						continue scan
					}
					j++
					word.WriteByte(l[j])
					inWord = true
				case ch == '\'':
					end := strings.IndexByte(l[j+1:], '\'')
					if end < 0 {
						return nil, fmt.Errorf("line %d: unterminated '", i+first-1)
					}
					word.WriteString(l[j+1 : j+1+end])
					j += 1 + end
					inWord = true
				case ch == '"':
					end := strings.IndexByte(l[j+1:], '"')
					if end < 0 {
						return nil, fmt.Errorf("line %d: unterminated \"", i+first-1)
					}
					s := l[j+1 : j+1+end]
					if strings.ContainsAny(s, "$`\\") {
						return nil, fmt.Errorf("line %d: %q: %w", i+first-1, s, errUnsupported)
					}
					word.WriteString(s)
					j += 1 + end
					inWord = true
				case ch == '#' && !inWord:
					c.Comment = strings.TrimSpace(l[j+1:])
					break scan
				case ch == '<' && !inWord && strings.HasPrefix(l[j:], "<<") && heredoc == "":
					rest := strings.TrimLeft(l[j+2:], " \t")
					end := strings.IndexAny(rest, " \t")
					if end < 0 {
						end = len(rest)
					}
					tag := rest[:end]
					if t, ok := strings.CutPrefix(tag, "'"); ok && strings.HasSuffix(t, "'") && len(t) > 1 {
						heredoc, quoted = strings.TrimSuffix(t, "'"), true
					} else if tag != "" && !strings.ContainsAny(tag, "\"'$`\\-") {
						heredoc = tag
					} else {
						return nil, fmt.Errorf("line %d: here-document %q: %w", i+first-1, tag, errUnsupported)
					}
					j = len(l) - len(rest) + end - 1
				case strings.IndexByte("|&;()<>$`*?[~", ch) >= 0:
					return nil, fmt.Errorf("line %d: %q: %w", i+first-1, string(ch), errUnsupported)
				default:
					word.WriteByte(ch)
					inWord = true
				}
			}
			break
		}
		flush()
		if heredoc != "" {
			var body strings.Builder
			for {
				if i == len(lines) {
					return nil, fmt.Errorf("line %d: here-document %s does not end", line, heredoc)
				}
				l := lines[i]
				i++
				if l == heredoc {
					break
				}
				if !quoted && strings.ContainsAny(l, "$`\\") {
					return nil, fmt.Errorf("line %d: unquoted here-document %s expands %q: %w", i+first-1, heredoc, l, errUnsupported)
				}
				body.WriteString(l + "\n")
			}
			c.Stdin = body.String()
		}
		if len(c.Args) == 0 {
			if heredoc != "" {
				return nil, fmt.Errorf("line %d: a here-document without a command", line)
			}
			continue // blank or a comment
		}
		c.Line = line
		cmds = append(cmds, c)
	}
	return cmds, nil
}

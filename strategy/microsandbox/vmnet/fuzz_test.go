package vmnet

import (
	"context"
	"net/netip"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

// fixedResolver answers every name with one public address.
type fixedResolver struct{}

func (fixedResolver) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	return []netip.Addr{netip.MustParseAddr("93.184.215.14")}, nil
}

// FuzzAnswerDNS: any datagram is answered with a well-formed response to
// the same id, or not at all (a response, or no DNS header), never a
// panic.
func FuzzAnswerDNS(f *testing.F) {
	for _, name := range []string{"example.com.", HostName + ".", "blocked.test.", "a.b.c.d.e.f.g.", "."} {
		for _, typ := range []dnsmessage.Type{dnsmessage.TypeA, dnsmessage.TypeAAAA, dnsmessage.TypeTXT} {
			b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 7, RecursionDesired: true})
			b.StartQuestions()
			b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: typ, Class: dnsmessage.ClassINET})
			msg, _ := b.Finish()
			f.Add(msg)
		}
	}
	f.Add([]byte{0, 1, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{0, 1})
	n, err := New(Config{Resolver: fixedResolver{}})
	if err != nil {
		f.Fatal(err)
	}
	defer n.Close()
	f.Fuzz(func(t *testing.T, query []byte) {
		resp := n.answerDNS(query)
		if resp == nil {
			return
		}
		var p dnsmessage.Parser
		h, err := p.Start(resp)
		if err != nil || !h.Response {
			t.Fatalf("answer %x to %x: %v, response %v", resp, query, err, h.Response)
		}
		var q dnsmessage.Parser
		if qh, err := q.Start(query); err == nil && qh.ID != h.ID {
			t.Fatalf("answered id %d to a query with id %d", h.ID, qh.ID)
		}
		if _, err := p.AllQuestions(); err != nil {
			t.Fatalf("answer's questions: %v", err)
		}
		if _, err := p.AllAnswers(); err != nil {
			t.Fatalf("answer's records: %v", err)
		}
	})
}

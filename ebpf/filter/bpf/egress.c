//go:build ignore

// egress.c: a sandbox's egress filter, a tc classifier attached on the
// ingress hook of the sandbox's tap (where guest -> host traffic arrives).
// Default deny; see ebpf/README.md for the rules, maps and audit events.
//
// Only classic helpers are used (map lookup/update, ring buffer, ktime) and
// direct packet access, so that the object loads on Linux 6.1 without
// kernel BTF.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/in.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

char __license[] SEC("license") = "Dual MIT/GPL";

#define MAX_PORT_RULES 8 /* policy.MaxPortRules */
#define NUM_PROXY_PORTS 4
#define FLOWS_MAX 16384
#define RINGBUF_SIZE (256 * 1024)

/* Reserved rule ids of infrastructure allows (filter.RuleARP, ...). */
#define RULE_ARP 0xFFFF0001
#define RULE_DHCP 0xFFFF0002
#define RULE_DNS 0xFFFF0003
#define RULE_PROXY 0xFFFF0004
#define RULE_IPV6 0xFFFF0005

enum verdict {
	VERDICT_ALLOW = 1,
	VERDICT_DENY = 2,
};

enum reason {
	REASON_NONE = 0,
	REASON_SPOOFED_SOURCE = 1,
	REASON_DNS_NOT_RESOLVER = 2,
	REASON_NO_RULE = 3,
	REASON_PORT = 4,
	REASON_PROTO = 5,
	REASON_IPV6 = 6,
	REASON_ETHERTYPE = 7,
	REASON_MALFORMED = 8,
	REASON_FRAGMENT = 9,
};

/* Addresses are kept as they are on the wire (network byte order); ports
 * and everything else in host byte order. */
struct config {
	__u32 guest_ip;
	__u32 gateway;
	__u16 proxy_ports[NUM_PROXY_PORTS];
	__u32 ipv6;
	__u32 generation;
};

struct lpm_key {
	__u32 prefixlen;
	__u8 addr[4];
};

struct port_rule {
	__u8 proto;
	__u8 _pad0;
	__u16 lo;
	__u16 hi;
	__u16 _pad1;
	__u32 rule_id;
};

struct allow_val {
	__u32 count;
	struct port_rule rules[MAX_PORT_RULES];
};

struct flow_key {
	__u8 saddr[16];
	__u8 daddr[16];
	__u16 sport;
	__u16 dport;
	__u8 proto;
	__u8 ipver;
	__u8 _pad[2];
};

struct counters {
	__u64 allowed_packets;
	__u64 allowed_bytes;
	__u64 denied_packets;
	__u64 denied_bytes;
	__u64 events_dropped;
};

struct event {
	__u64 timestamp; /* bpf_ktime_get_ns */
	__u8 saddr[16];  /* IPv4: the first 4 bytes */
	__u8 daddr[16];
	__u16 sport;
	__u16 dport;
	__u8 proto;
	__u8 ipver;
	__u8 verdict;
	__u8 reason;
	__u32 rule_id;
	__u32 _pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct config);
} config_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 4096);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct lpm_key);
	__type(value, struct allow_val);
} allow_v4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, FLOWS_MAX);
	__type(key, struct flow_key);
	__type(value, __u32);
} flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct counters);
} counters_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, RINGBUF_SIZE);
} events_ringbuf SEC(".maps");

struct pkt {
	struct flow_key fk;
	__u32 rule_id;
	__u8 reason;
};

static __always_inline int finish(struct __sk_buff *skb, struct pkt *p, int allow, __u32 generation)
{
	__u32 zero = 0;
	struct counters *c = bpf_map_lookup_elem(&counters_map, &zero);
	int emit = !allow;
	__u32 *gen = 0;

	if (c) {
		if (allow) {
			c->allowed_packets++;
			c->allowed_bytes += skb->len;
		} else {
			c->denied_packets++;
			c->denied_bytes += skb->len;
		}
	}
	if (allow && p->fk.ipver != 0) {
		gen = bpf_map_lookup_elem(&flows, &p->fk);
		emit = !gen || *gen != generation;
	}
	if (emit) {
		struct event *e = bpf_ringbuf_reserve(&events_ringbuf, sizeof(*e), 0);
		if (!e) {
			if (c)
				c->events_dropped++;
		} else {
			e->timestamp = bpf_ktime_get_ns();
			__builtin_memcpy(e->saddr, p->fk.saddr, 16);
			__builtin_memcpy(e->daddr, p->fk.daddr, 16);
			e->sport = p->fk.sport;
			e->dport = p->fk.dport;
			e->proto = p->fk.proto;
			e->ipver = p->fk.ipver;
			e->verdict = allow ? VERDICT_ALLOW : VERDICT_DENY;
			e->reason = p->reason;
			e->rule_id = p->rule_id;
			e->_pad = 0;
			bpf_ringbuf_submit(e, 0);
			/* Remember the flow only once its event is out, so that a
			 * full ring buffer does not lose the flow's audit record. */
			if (allow)
				bpf_map_update_elem(&flows, &p->fk, &generation, BPF_ANY);
		}
	}
	return allow ? TC_ACT_OK : TC_ACT_SHOT;
}

SEC("tc")
int egress_filter(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct pkt p = {};
	__u32 zero = 0;
	__u32 generation = 0;
	struct config *cfg = bpf_map_lookup_elem(&config_map, &zero);
	if (cfg)
		generation = cfg->generation;

	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > data_end) {
		p.reason = REASON_MALFORMED;
		return finish(skb, &p, 0, generation);
	}
	__u16 ethertype = bpf_ntohs(eth->h_proto);

	if (ethertype == ETH_P_ARP) {
		p.rule_id = RULE_ARP;
		return finish(skb, &p, 1, generation);
	}

	if (ethertype == ETH_P_IPV6) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);
		if ((void *)(ip6 + 1) > data_end) {
			p.reason = REASON_MALFORMED;
			return finish(skb, &p, 0, generation);
		}
		p.fk.ipver = 6;
		p.fk.proto = ip6->nexthdr;
		__builtin_memcpy(p.fk.saddr, &ip6->saddr, 16);
		__builtin_memcpy(p.fk.daddr, &ip6->daddr, 16);
		if (cfg && cfg->ipv6) {
			p.rule_id = RULE_IPV6;
			return finish(skb, &p, 1, generation);
		}
		p.reason = REASON_IPV6;
		return finish(skb, &p, 0, generation);
	}

	if (ethertype != ETH_P_IP) {
		p.reason = REASON_ETHERTYPE;
		return finish(skb, &p, 0, generation);
	}

	struct iphdr *ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > data_end) {
		p.reason = REASON_MALFORMED;
		return finish(skb, &p, 0, generation);
	}
	p.fk.ipver = 4;
	p.fk.proto = ip->protocol;
	__builtin_memcpy(p.fk.saddr, &ip->saddr, 4);
	__builtin_memcpy(p.fk.daddr, &ip->daddr, 4);
	__u32 ihl = ip->ihl;
	if (ip->version != 4 || ihl < 5) {
		p.reason = REASON_MALFORMED;
		return finish(skb, &p, 0, generation);
	}
	void *l4 = (void *)ip + ihl * 4;
	if (l4 > data_end) {
		p.reason = REASON_MALFORMED;
		return finish(skb, &p, 0, generation);
	}
	/* A non-first fragment carries no transport header: its ports are
	 * unknown. */
	int later_frag = (bpf_ntohs(ip->frag_off) & 0x1fff) != 0;
	__u8 proto = ip->protocol;
	__u16 sport = 0, dport = 0;
	if (!later_frag) {
		if (proto == IPPROTO_TCP) {
			struct tcphdr *th = l4;
			if ((void *)(th + 1) > data_end) {
				p.reason = REASON_MALFORMED;
				return finish(skb, &p, 0, generation);
			}
			sport = bpf_ntohs(th->source);
			dport = bpf_ntohs(th->dest);
		} else if (proto == IPPROTO_UDP) {
			struct udphdr *uh = l4;
			if ((void *)(uh + 1) > data_end) {
				p.reason = REASON_MALFORMED;
				return finish(skb, &p, 0, generation);
			}
			sport = bpf_ntohs(uh->source);
			dport = bpf_ntohs(uh->dest);
		} else if (proto == IPPROTO_ICMP) {
			if (l4 + 4 > data_end) {
				p.reason = REASON_MALFORMED;
				return finish(skb, &p, 0, generation);
			}
		}
	}
	p.fk.sport = sport;
	p.fk.dport = dport;

	__u32 saddr = ip->saddr;
	__u32 daddr = ip->daddr;
	__u32 guest_ip = cfg ? cfg->guest_ip : 0;
	__u32 gateway = cfg ? cfg->gateway : 0;
	int dhcp = !later_frag && proto == IPPROTO_UDP && dport == 67;

	/* DHCP, to the sandbox's DHCP server (the gateway) or broadcast. */
	int dhcp_ok = dhcp && (gateway == 0 || daddr == gateway || daddr == 0xffffffff);

	if (guest_ip != 0 && saddr != guest_ip) {
		/* A DHCP client has no address yet: 0.0.0.0:68 -> :67, and
		 * that is all such a source may send. */
		if (!(dhcp_ok && saddr == 0 && sport == 68)) {
			p.reason = REASON_SPOOFED_SOURCE;
			return finish(skb, &p, 0, generation);
		}
	}
	if (dhcp_ok) {
		p.rule_id = RULE_DHCP;
		return finish(skb, &p, 1, generation);
	}
	if (!later_frag && (proto == IPPROTO_UDP || proto == IPPROTO_TCP) && dport == 53) {
		if (gateway != 0 && daddr == gateway) {
			p.rule_id = RULE_DNS;
			return finish(skb, &p, 1, generation);
		}
		p.reason = REASON_DNS_NOT_RESOLVER;
		return finish(skb, &p, 0, generation);
	}
	if (cfg && !later_frag && proto == IPPROTO_TCP && gateway != 0 && daddr == gateway && dport != 0) {
		int i;
#pragma unroll
		for (i = 0; i < NUM_PROXY_PORTS; i++) {
			if (cfg->proxy_ports[i] == dport) {
				p.rule_id = RULE_PROXY;
				return finish(skb, &p, 1, generation);
			}
		}
	}

	struct lpm_key key = {.prefixlen = 32};
	__builtin_memcpy(key.addr, &daddr, 4);
	struct allow_val *val = bpf_map_lookup_elem(&allow_v4, &key);
	if (!val) {
		p.reason = REASON_NO_RULE;
		return finish(skb, &p, 0, generation);
	}
	__u32 count = val->count;
	int proto_seen = 0;
	int i;
	for (i = 0; i < MAX_PORT_RULES; i++) {
		if (i >= count)
			break;
		struct port_rule *r = &val->rules[i];
		if (r->proto != 0 && r->proto != proto)
			continue;
		proto_seen = 1;
		if (proto == IPPROTO_TCP || proto == IPPROTO_UDP) {
			if (later_frag) {
				/* Ports unknown: only a rule for every port matches. */
				if (r->lo != 0 || r->hi != 0xffff)
					continue;
			} else if (dport < r->lo || dport > r->hi) {
				continue;
			}
		}
		p.rule_id = r->rule_id;
		return finish(skb, &p, 1, generation);
	}
	if (later_frag && proto_seen && (proto == IPPROTO_TCP || proto == IPPROTO_UDP))
		p.reason = REASON_FRAGMENT;
	else
		p.reason = proto_seen ? REASON_PORT : REASON_PROTO;
	return finish(skb, &p, 0, generation);
}

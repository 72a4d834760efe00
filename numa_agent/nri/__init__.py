"""numa-agent as an NRI plugin: the wire (ttrpc framing, NRI's connection
multiplexer) and the plugin session. It carries no Kubernetes meaning: that is
the `NriHandler` the session is given."""

package agent

// CapUpgrade is offered in Hello when the agent has an Upgrader: the node
// runs "upgrade" commands.
const CapUpgrade = "upgrade"

package agent

// CapUpgrade is offered in Hello when the agent has an Upgrader: the node
// runs "upgrade" commands.
const CapUpgrade = "upgrade"

// CapRollback is offered in Hello when the agent's Upgrader also rolls
// back (executor.Rollbacker): the node runs "rollback" commands.
const CapRollback = "rollback"

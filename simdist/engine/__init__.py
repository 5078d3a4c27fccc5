"""The discrete-event core (simpy): ranks, process groups, collective matching, values."""

"""The concrete providers; ``numa_agent.admission.registry`` lists them."""

"""What makes a forward faster on a given machine, behind one seam: torch.compile of the target and the
EAGLE head (compiled, head_compile), the pure choices over measured timings (graph_choice), eager
linear layouts (linear_layout), the garbage collector's settling (heap) and the speed environment
variables parsed once (settings). Only the composition (models/ adapters, runner, cli) imports it;
the algorithm (engine, tree, verify, cost, drafters, retrieval) never does."""

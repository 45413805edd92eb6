"""Product-sandbox runs: Benchwright-built environment benchmarks (recipes) worked by a tool-using agent."""

from bench.promql.run import main

main()
